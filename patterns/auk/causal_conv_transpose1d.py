"""Causal transposed conv of an AuK upsample stage (`CausalConvTranspose1d`): the conv and its crop.

Matches:  slice(conv_transpose1d(x, weight, bias, stride, [0], [0], 1, [1]), 2, None, end)
          (`end` is the graph's SymInt node for L * stride: the crop keeps the first L * stride samples)
Replaces: rewrite::causal_conv_transpose1d(x, weight, bias, stride)
Exactness: exact (the op runs the same transposed conv and returns the same strided view).
Level: lossless.
Guard: x is [B, C, L]; one stride value; `end` is provably L * stride (symbolically, for every length).
"""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from rewrite.engine.pattern import variants
from rewrite.models.auk import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten


def search(x, weight, bias, end, stride):
    return aten.slice.Tensor(aten.conv_transpose1d.default(x, weight, bias, stride, [0], [0], 1, [1]), 2, None, end)


def replace(x, weight, bias, end, stride):
    return torch.ops.rewrite.causal_conv_transpose1d.default(x, weight, bias, stride)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    stride = match.scalars["stride"]
    if x.dim() != 3:
        return f"x {tuple(x.shape)} is not [B, C, L]"
    if len(stride) != 1:
        return f"stride {stride} is not one value"
    end = match.inputs["end"].meta.get("val")
    if end is None or not statically_known_true(end == x.shape[-1] * stride[0]):
        return f"the crop end {end} is not L * stride = {x.shape[-1]} * {stride[0]}"
    return None


PATTERNS = variants(search, replace, guard, name="causal_conv_transpose1d", exactness="exact", level="lossless",
                    scalars=("stride",), module_types=("CausalConvTranspose1d",))
