"""Alias-free SnakeBeta activation of the AuK decoder (`AliasFreeSnakeBeta`, 109 per full decoder).

Matches:  rewrite::alias_free_snake_module(x, alpha, beta, taps, True): the module call as the AuK capture
          records it (`rewrite.models.auk.capture`, the default); or, in a graph captured with
          ``activations_as_ops=False`` (patterns named ``[..., aten]``), its ATen ops:
          u = slice(mul(conv_transpose1d(pad(x, [5, 5], "replicate"), expand(taps, [C, -1, -1]), None,
                                         [2], [0], [0], C), 2), 2, 15, -15)
          a = exp(view(alpha, [1, -1, 1]));  b = exp(view(beta, [1, -1, 1]))
          v = u + mul(reciprocal(b + 1e-9), 1.0) * pow(sin(u * a), 2)
          conv1d(pad(v, [11, 0], "replicate"), expand(taps, [C, -1, -1]), None, [2], [0], [1], C)
          (the canonical graph of `upsample -> SnakeBeta -> downsample` with log-scale alpha/beta; `C` is a
          literal placeholder bound once for both expands and both `groups`; the taps buffer feeds both convs)
Replaces: [exact] rewrite::alias_free_snake_exact(x, alpha, beta, taps, True)   (rewrite.models.auk.ops)
          [fused] rewrite::alias_free_snake(x, alpha, beta, taps, True)         (rewrite.models.auk.alias_free)
Exactness: [exact] exact (the op runs the same ATen calls); [fused] tolerance (the Triton kernel sums the
          filters in its own order; see rewrite.models.auk.alias_free for the measured error).
Level: [exact] lossless; [fused] channels_last. Same search: [fused] is listed first, so at channels_last
          it takes every site and [exact] matches none.
Guard: x is [B, C, T] (with C == the bound channel count for the ATen form); alpha and beta hold C values
          of x's dtype; taps holds 12 values of x's dtype. A model with `snake_logscale=False` (no exp) matches
          nothing and keeps the module op (its ATen calls) or its ATen ops.
"""

from __future__ import annotations

import dataclasses

import torch

from rewrite.engine.pattern import variants
from rewrite.models.auk import alias_free as _fused_op  # noqa: F401  (registers torch.ops.rewrite.alias_free_snake)
from rewrite.models.auk import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.kernels.alias_free.geometry import DOWN_PAD, FILTER_TAPS, RESAMPLE_RATIO, SNAKE_EPS, UP_CROP, UP_PAD

aten = torch.ops.aten


def search_module_op(x, alpha, beta, taps, impl):
    return torch.ops.rewrite.alias_free_snake_module.default(x, alpha, beta, taps, True)


def replace_module_op(x, alpha, beta, taps, impl):
    return replace(x, alpha, beta, taps, None, impl)


def search(x, alpha, beta, taps, channels, impl):
    padded = aten.pad.default(x, [UP_PAD, UP_PAD], "replicate")
    up = aten.conv_transpose1d.default(padded, aten.expand.default(taps, [channels, -1, -1]), None,
                                       [RESAMPLE_RATIO], [0], [0], channels)
    u = aten.slice.Tensor(aten.mul.Tensor(up, RESAMPLE_RATIO), 2, UP_CROP, -UP_CROP)
    a = aten.exp.default(aten.view.default(alpha, [1, -1, 1]))
    b = aten.exp.default(aten.view.default(beta, [1, -1, 1]))
    inv_b = aten.mul.Tensor(aten.reciprocal.default(aten.add.Tensor(b, SNAKE_EPS)), 1.0)
    v = aten.add.Tensor(u, aten.mul.Tensor(inv_b, aten.pow.Tensor_Scalar(aten.sin.default(aten.mul.Tensor(u, a)), 2)))
    return aten.conv1d.default(aten.pad.default(v, [DOWN_PAD, 0], "replicate"),
                               aten.expand.default(taps, [channels, -1, -1]), None, [RESAMPLE_RATIO], [0], [1],
                               channels)


def replace(x, alpha, beta, taps, channels, impl):
    if impl == "fused":
        return torch.ops.rewrite.alias_free_snake.default(x, alpha, beta, taps, True)
    return torch.ops.rewrite.alias_free_snake_exact.default(x, alpha, beta, taps, True)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    channels = match.scalars.get("channels", x.shape[1] if x.dim() == 3 else None)  # unbound in the op form
    if x.dim() != 3 or x.shape[1] != channels:
        return f"x {tuple(x.shape)} is not [B, {channels}, T]"
    for name in ("alpha", "beta"):
        value = match.inputs[name].meta["val"]
        if value.numel() != channels or value.dtype != x.dtype:
            return f"{name} {tuple(value.shape)} {value.dtype} does not hold {channels} values of {x.dtype}"
    taps = match.inputs["taps"].meta["val"]
    if taps.numel() != FILTER_TAPS or taps.dtype != x.dtype:
        return f"taps {tuple(taps.shape)} {taps.dtype} is not {FILTER_TAPS} values of {x.dtype}"
    return None


def _named(impl: str, exactness: str, level: str, form: str):
    """One pattern named `alias_free_activation[impl]` (the module op) or `alias_free_activation[impl, aten]`
    (family `alias_free_activation`)."""
    search_fn, replace_fn, scalars = ((search_module_op, replace_module_op, ()) if form == "op"
                                      else (search, replace, ("channels",)))
    [pattern] = variants(search_fn, replace_fn, guard, name="alias_free_activation", exactness=exactness, level=level,
                         scalars=scalars, module_types=("AliasFreeSnakeBeta",), impl=(impl,))
    return dataclasses.replace(pattern, name=f"alias_free_activation[{impl}{', aten' if form == 'aten' else ''}]")


# [fused] first: at channels_last it must win over [exact], which has the same search.
PATTERNS = tuple(_named(impl, exactness, level, form) for form in ("op", "aten")
                 for impl, exactness, level in (("fused", "tolerance", "channels_last"), ("exact", "exact", "lossless")))
