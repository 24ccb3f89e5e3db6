"""A Wan causal conv3d from its unpadded input: the input assembly, the conv and its bias (+ residual).

Matches:  (p, cache') = rewrite::causal_conv_input(x, cache, pad, mode); conv3d(p, weight, bias)
          or rewrite::conv3d_residual(p, weight, bias, residual)   (after both families matched; the padded
          input p has no other user; bias and residual each present or absent; chunk 0 without a cache)
Replaces: rewrite::causal_conv3d(x, cache, pad, mode, weight, bias, residual) -> (output, cache')
Exactness: exact. The padded input is written channels-last (data movement), cuDNN convolves it without
          the NCDHW<->NDHWC transposes only for shapes where `selftest.channels_last_conv_is_exact` found its
          output `torch.equal` to the NCDHW conv on the running GPU (else the op runs the replaced ops), and
          bias and residual are added with ATen's two roundings.
Level: lossless.
Guard: x is 5-D; the padded input feeds only this conv.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten
rewrite_ops = torch.ops.rewrite


def _conv(padded, weight, bias, residual):
    if residual is None:
        return aten.conv3d.default(padded, weight, bias)
    return rewrite_ops.conv3d_residual.default(padded, weight, bias, residual)


def search(x, cache, weight, bias, residual, pad, mode):
    assembled = rewrite_ops.causal_conv_input.default(x, cache, pad, mode)
    return _conv(assembled[0], weight, bias, residual), assembled[1]


def replace(x, cache, weight, bias, residual, pad, mode):
    out = rewrite_ops.causal_conv3d.default(x, cache, pad, mode, weight, bias, residual)
    return out[0], out[1]


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    if x.dim() != 5:
        return f"x is {x.dim()}-D, expected [b, c, t, h, w]"
    return None


PATTERNS = variants(search, replace, guard, name="causal_conv3d", exactness="exact", level="lossless",
                    scalars=("pad", "mode"), optional=("residual", "bias", "cache"),
                    module_types=("WanCausalConv3d",))
