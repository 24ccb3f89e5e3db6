"""The fused Wan norm + causal conv3d with our own Triton convolution (level ``channels_last``).

Matches:  rewrite::rms_norm_causal_conv3d(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight,
                                          bias, residual, x_bias, residual_bias, channels_last_out)
          (after every family that builds or rewires that op: `rms_norm_causal_conv3d`, `residual_bias`,
          `norm_input_bias`; cache, bias, residual and the deferred biases each present or absent)
Replaces: rewrite::rms_norm_causal_conv3d_fast(the same arguments) (`rewrite.models.wan.ops_fast`)
Exactness: tolerance. The conv is `rewrite.kernels.conv3d.conv3d`'s implicit GEMM (or, where measured faster,
          `rewrite.kernels.winograd`'s F(2x2, 3x3) with its transforms' roundings): its fp32 sum runs in another
          order than cuDNN's, and bias and residual are added before the one rounding (the README's
          `channels_last` contract; measured in docs/results.md). Where the op's kernel path does not serve a
          call, it runs the replaced `lossless` op.
Level: channels_last.
Guard: the graph runs on CUDA (or on CPU under the Triton interpreter, for tests), and `wan_fast.fast_reason`
          accepts the conv: bf16/fp16 and a shape the Triton conv tiles and `triton_conv3d.chosen` measured
          faster than cuDNN's, or one `winograd.chosen` measured faster than both on the card, or (cuDNN's conv
          kept) a channel count whose one-pass norm measured faster than the exact one (the reason names what
          declined).
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.models.wan.ops import ConvStage
from rewrite.patterns.common.guards import triton_causal_conv_guard

rewrite_ops = torch.ops.rewrite


def search(x, stage: ConvStage, residual, x_bias, residual_bias, channels_last_out):
    out = rewrite_ops.rms_norm_causal_conv3d.default(x, *stage, residual, x_bias, residual_bias, channels_last_out)
    return out[0], out[1]


def replace(x, stage: ConvStage, residual, x_bias, residual_bias, channels_last_out):
    out = rewrite_ops.rms_norm_causal_conv3d_fast.default(x, *stage, residual, x_bias, residual_bias,
                                                          channels_last_out)
    return out[0], out[1]


guard = triton_causal_conv_guard(wan_fast.fast_reason, "the Triton conv")


PATTERNS = variants(search, replace, guard, name="rms_norm_causal_conv3d_fast", exactness="tolerance",
                    level="channels_last", scalars=("channels_last_out",),
                    optional=("residual_bias", "x_bias", "residual", "bias", "cache"),
                    module_types=("WanResidualBlock", "WanCausalConv3d"))
