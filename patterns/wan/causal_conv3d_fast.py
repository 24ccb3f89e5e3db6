"""The Wan causal conv3d of a narrow input (the encoder's first conv: the video's 3 channels) with our own Triton
convolution over the input widened with zero channels (level ``channels_last``).

Matches:  rewrite::causal_conv3d(x, cache, pad, mode, weight, bias, residual)   (after `causal_conv3d` built it
          and `rms_norm_causal_conv3d` took the ones a norm feeds; cache, bias and residual each present or
          absent)
Replaces: rewrite::causal_conv3d_fast(the same arguments) (`rewrite.models.wan.causal_conv_fast`)
Exactness: tolerance. The zero channels add exact zeros; the conv's fp32 sum runs in the Triton conv's order
          rather than cuDNN's, and bias and residual are added before the one rounding (the README's
          `channels_last` contract). Where the op's kernel path does not serve a call, it runs the replaced op.
Level: channels_last.
Guard: the graph runs on CUDA (or on CPU under the Triton interpreter, for tests), x is 5-D with a causal pad of
          six non-negative entries, and `causal_conv_fast.reason` accepts the conv: fewer than 16 input channels,
          bf16/fp16, and the widened conv's shape chosen for the Triton conv on this card.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import causal_conv_fast
from rewrite.patterns.common.guards import triton_causal_conv_guard

rewrite_ops = torch.ops.rewrite


def search(x, cache, weight, bias, residual, pad, mode):
    out = rewrite_ops.causal_conv3d.default(x, cache, pad, mode, weight, bias, residual)
    return out[0], out[1]


def replace(x, cache, weight, bias, residual, pad, mode):
    out = rewrite_ops.causal_conv3d_fast.default(x, cache, pad, mode, weight, bias, residual)
    return out[0], out[1]


guard = triton_causal_conv_guard(causal_conv_fast.reason, "the Triton conv")


PATTERNS = variants(search, replace, guard, name="causal_conv3d_fast", exactness="tolerance", level="channels_last",
                    scalars=("pad", "mode"), optional=("residual", "bias", "cache"),
                    module_types=("WanCausalConv3d",))
