"""Causal conv1d of the AuK decoder (`CausalConv1d`), with the residual add of an AMP unit folded in.

Matches:  y = conv1d(pad(x, pad), weight, bias, [1], [0], dilation, 1)      (zero pad, left only)
          [residual]   add(residual, y)   (`AMPBlock`'s x = x + conv2(...), in that operand order)
          [bias=None]  bias is None       (`conv_post`)
Replaces: rewrite::causal_conv1d(x, weight, bias, dilation, residual)   (residual None without the add)
          One op family for both: a future kernel can add the residual in its epilogue.
Exactness: exact (the op runs the same pad, conv and add).
Level: lossless.
Guard: x and the output are 3-D; pad == [dilation * (k - 1), 0]; the residual has the output's shape and
dtype (no broadcasting or promotion in the add). The [residual] variants are listed first, so a
conv that feeds a residual add is matched with its add.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from rewrite.engine.pattern import variants
from rewrite.ops import auk as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten


def search(x, weight, bias, residual, pad, dilation):
    y = aten.conv1d.default(aten.pad.default(x, pad), weight, bias, [1], [0], dilation, 1)
    return aten.add.Tensor(residual, y)


def replace(x, weight, bias, residual, pad, dilation):
    return torch.ops.rewrite.causal_conv1d.default(x, weight, bias, dilation, residual)


def search_no_bias(x, weight, residual, pad, dilation):
    y = aten.conv1d.default(aten.pad.default(x, pad), weight, None, [1], [0], dilation, 1)
    return aten.add.Tensor(residual, y)


def replace_no_bias(x, weight, residual, pad, dilation):
    return torch.ops.rewrite.causal_conv1d.default(x, weight, None, dilation, residual)


def search_plain(x, weight, bias, pad, dilation):
    return aten.conv1d.default(aten.pad.default(x, pad), weight, bias, [1], [0], dilation, 1)


def replace_plain(x, weight, bias, pad, dilation):
    return torch.ops.rewrite.causal_conv1d.default(x, weight, bias, dilation, None)


def search_plain_no_bias(x, weight, pad, dilation):
    return aten.conv1d.default(aten.pad.default(x, pad), weight, None, [1], [0], dilation, 1)


def replace_plain_no_bias(x, weight, pad, dilation):
    return torch.ops.rewrite.causal_conv1d.default(x, weight, None, dilation, None)


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


_COMMON = dict(name="causal_conv1d", exactness="exact", level="lossless", scalars=("pad", "dilation"),
               module_types=("CausalConv1d",))


def _named(search_fn, replace_fn, label: str):
    """One pattern named `causal_conv1d[label]` (family `causal_conv1d`)."""
    [pattern] = variants(search_fn, replace_fn, guard, **_COMMON)
    return dataclasses.replace(pattern, name=f"causal_conv1d[{label}]" if label else "causal_conv1d")


# Residual variants first: a conv feeding a residual add is matched together with its add.
PATTERNS = (
    _named(search, replace, "residual"),
    _named(search_no_bias, replace_no_bias, "residual, bias=None"),
    _named(search_plain, replace_plain, ""),
    _named(search_plain_no_bias, replace_plain_no_bias, "bias=None"),
)
