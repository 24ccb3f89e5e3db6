"""Causal conv1d of the AuK decoder (`CausalConv1d`), with the residual add of an AMP unit folded in.

Matches:  y = conv1d(pad(x, pad), weight, bias, [1], [0], dilation, 1)      (zero pad, left only)
          then add(residual, y)  (`AMPBlock`'s x = x + conv2(...), in that operand order)
          [residual=None]  no add;  [bias=None]  bias is None  (`conv_post`): four variants
Replaces: rewrite::causal_conv1d(x, weight, bias, dilation, residual)   (residual None without the add)
          One op family for both: a future kernel can add the residual in its epilogue.
Exactness: exact (the op runs the same pad, conv and add).
Level: lossless.
Guard: x and the output are 3-D; pad == [dilation * (k - 1), 0]; the residual has the output's shape and
dtype (no broadcasting or promotion in the add). The variants with the residual are listed first, so a
conv that feeds a residual add is matched with its add.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from rewrite.engine.pattern import variants
from rewrite.models.auk import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten


def search(x, weight, bias, residual, pad, dilation):
    y = aten.conv1d.default(aten.pad.default(x, pad), weight, bias, [1], [0], dilation, 1)
    return y if residual is None else aten.add.Tensor(residual, y)


def replace(x, weight, bias, residual, pad, dilation):
    return torch.ops.rewrite.causal_conv1d.default(x, weight, bias, dilation, residual)


def guard(match) -> str | None:
    x, weight = match.inputs["x"].meta["val"], match.inputs["weight"].meta["val"]
    out = match.outputs[0].meta["val"]
    dilation, pad = match.scalars["dilation"], match.scalars["pad"]
    if x.dim() != 3 or out.dim() != 3 or weight.dim() != 3:
        return f"x {tuple(x.shape)} is not a [B, C, T] conv1d input"
    if len(dilation) != 1:
        return f"dilation {dilation} is not one value"
    expected = [dilation[0] * (weight.shape[-1] - 1), 0]
    if list(pad) != expected:
        return (f"pad {list(pad)} is not the causal left pad {expected} of kernel {weight.shape[-1]}, "
                f"dilation {dilation[0]}")
    if "residual" in match.inputs:
        residual = match.inputs["residual"].meta["val"]
        same = residual.dim() == 3 and all(statically_known_true(a == b) for a, b in zip(residual.shape, out.shape))
        if not same or residual.dtype != out.dtype:
            return (f"residual {tuple(residual.shape)} {residual.dtype} would broadcast or promote into "
                    f"{tuple(out.shape)} {out.dtype}")
    return None


# Residual variants first (`optional` order): a conv feeding a residual add is matched together with its add.
PATTERNS = variants(search, replace, guard, name="causal_conv1d", exactness="exact", level="lossless",
                    scalars=("pad", "dilation"), optional=("residual", "bias"), module_types=("CausalConv1d",))
