"""Reference implementations of the Wan custom ops: the ATen ops, in the order, of the subgraphs they replace.

A rewritten graph running these is `torch.equal` to the captured one on any device and dtype. The ops
(`rewrite.models.wan.ops`) run them where their kernels do not serve a call, the kernels compute their output
layouts from them (`rewrite.kernels.layout.reference_layout`), and the fakes follow them. This module imports
no kernel; the references of the single-kernel ops (norm, upsample, interleave) live with their kernels'
families (`rewrite.kernels.norm.reference`, `rewrite.kernels.upsample.reference`) and are imported here. The references of the ops that combine other ops (`causal_conv3d`, `rms_norm_causal_conv3d`,
`upsample_conv2d`, `upsample_conv2d_dup_up_add`) call those ops through `torch.ops.rewrite` (registered by
`rewrite.models.wan.ops`), as the graph they replace did after the families matched one by one: each of those may
still run its own kernel.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rewrite.kernels.norm.reference import rms_norm_reference  # noqa: F401  (the rms_norm op's reference)
from rewrite.kernels.upsample.reference import (  # noqa: F401  (the upsample ops' references)
    temporal_interleave_reference, upsample_nearest2x_reference)

aten = torch.ops.aten
rewrite_ops = torch.ops.rewrite
END = 2**63 - 1  # what `x[:, :, -2:]` records as the slice end
CACHE_MODES = ("steady_t1", "steady", "chunk0")


# ---- causal conv input assembly and the next cache ------------------------------------------------------
def next_cache_reference(x: Tensor, cache: Optional[Tensor], mode: str) -> Tensor:
    """The cache the next chunk's causal conv reads (see `causal_conv_input_reference`)."""
    tail = aten.clone.default(aten.slice.Tensor(x, 2, -2, END))
    if mode == "chunk0":
        return aten.cat.default([aten.zeros_like.default(tail), tail], 2)
    if mode == "steady":
        return tail
    if mode != "steady_t1":
        raise ValueError(f"causal_conv_input: unknown mode {mode!r}; expected one of {CACHE_MODES}")
    if cache is None:
        raise ValueError(f"causal_conv_input: mode {mode!r} needs a cache tensor")
    return aten.cat.default([aten.unsqueeze.default(aten.select.int(cache, 2, -1), 2), tail], 2)


def causal_conv_input_reference(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str) -> tuple[Tensor, Tensor]:
    """(conv input, next cache) of a Wan causal conv.

    steady_t1: input `pad(cat([cache, x], 2))`, next cache `cat([cache[:, :, -1:], x[:, :, -2:]], 2)` (x has 1 frame)
    steady:    input `pad(cat([cache, x], 2))`, next cache `x[:, :, -2:].clone()` (x has >= 2 frames)
    chunk0:    input `pad(x)`, next cache `cat([zeros, x[:, :, -2:]], 2)` (steady form of a 1-frame cache)
    """
    next_cache = next_cache_reference(x, cache, mode)
    if mode == "chunk0":
        return aten.pad.default(x, pad), next_cache
    return aten.pad.default(aten.cat.default([cache, x], 2), pad), next_cache


# ---- conv3d (bias included) + residual add -------------------------------------------------------------
def conv3d_residual_reference(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Tensor) -> Tensor:
    """`conv3d(x, weight, bias) + residual`."""
    return aten.add.Tensor(aten.conv3d.default(x, weight, bias), residual)


# ---- causal conv3d: input assembly, conv, bias (+ residual) -----------------------------------------------
def causal_conv3d_reference(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
                            bias: Optional[Tensor], residual: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """`conv3d(padded, weight, bias) [+ residual]` and the next cache, `padded` as `causal_conv_input` makes it.
    The weight is made contiguous (a no-op for the module's own; the runtime may pass a channels-last copy)."""
    padded, next_cache = rewrite_ops.causal_conv_input.default(x, cache, pad, mode)
    weight = aten.contiguous.default(weight)
    if residual is None:
        return aten.conv3d.default(padded, weight, bias), next_cache
    return rewrite_ops.conv3d_residual.default(padded, weight, bias, residual), next_cache


# ---- RMS norm (+ SiLU) feeding a causal conv3d ------------------------------------------------------------
def with_deferred_bias(x: Tensor, bias: Optional[Tensor]) -> Tensor:
    """A conv output whose bias `add_` was deferred, completed as ATen completes it: `x.add_(bias)` on the
    contiguous conv output (the layout ATen's conv of a contiguous input has)."""
    if bias is None:
        return x
    return aten.add.Tensor(aten.contiguous.default(x), aten.view.default(bias, [-1, 1, 1, 1]))


def rms_norm_causal_conv3d_reference(x: Tensor, gamma: Tensor, scale: float, norm_bias: float, eps: float,
                                     upcast: bool, act: Optional[str], cache: Optional[Tensor], pad: list[int],
                                     mode: str, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                                     x_bias: Optional[Tensor] = None, residual_bias: Optional[Tensor] = None,
                                     channels_last_out: bool = False) -> tuple[Tensor, Tensor]:
    """`rms_norm` then `causal_conv3d`, the deferred biases completed first (`with_deferred_bias`); with
    `channels_last_out`, the output copied into channels-last memory."""
    normalized = rewrite_ops.rms_norm.default(with_deferred_bias(x, x_bias), gamma, scale, norm_bias, eps, upcast, act)
    residual = None if residual is None else with_deferred_bias(residual, residual_bias)
    out, next_cache = rewrite_ops.causal_conv3d.default(normalized, cache, pad, mode, weight, bias, residual)
    if channels_last_out:
        out = out.contiguous(memory_format=torch.channels_last_3d)
    return out, next_cache


# ---- nearest-exact 2x upsample feeding a conv2d (Wan's Resample) ------------------------------------------
def upsample_conv2d_reference(x: Tensor, upcast: bool, weight: Tensor, bias: Optional[Tensor], stride: list[int],
                              padding: list[int]) -> Tensor:
    """The replaced subgraph (the weight made contiguous, as in `causal_conv3d_reference`)."""
    return aten.conv2d.default(rewrite_ops.upsample_nearest2x.default(x, upcast), aten.contiguous.default(weight), bias,
                               stride, padding)


# ---- Wan 2.2 DupUp3D shortcut + add ---------------------------------------------------------------------
def dup_up_add_reference(main: Tensor, x: Tensor, repeats: int, unfold_shape: list[int], fold_shape: list[int],
                         first_frame: int) -> Tensor:
    """`main + DupUp3D(x)`: repeat channels, unfold into (t, h, w) factors, [drop the first frames,] add."""
    d = aten.repeat_interleave.self_int(x, repeats, 1)
    d = aten.view.default(aten.contiguous.default(aten.permute.default(
        aten.view.default(d, unfold_shape), [0, 1, 5, 2, 6, 3, 7, 4])), fold_shape)
    if first_frame > 0:
        d = aten.slice.Tensor(d, 2, first_frame, END)
    return aten.add.Tensor(main, d)


# ---- Wan 2.2 up block end: upsample + conv2d, then the DupUp3D shortcut added -----------------------------
def upsample_conv2d_dup_up_add_reference(x: Tensor, upcast: bool, weight: Tensor, bias: Optional[Tensor],
                                         stride: list[int], padding: list[int], frames_shape: list[int], dx: Tensor,
                                         repeats: int, unfold_shape: list[int], fold_shape: list[int],
                                         first_frame: int) -> Tensor:
    """`dup_up_add(permute(view(upsample_conv2d(x, ...), frames_shape), [0, 2, 1, 3, 4]), dx, ...)`."""
    y = rewrite_ops.upsample_conv2d.default(x, upcast, weight, bias, stride, padding)
    main = aten.permute.default(aten.view.default(y, frames_shape), [0, 2, 1, 3, 4])
    return rewrite_ops.dup_up_add.default(main, dx, repeats, unfold_shape, fold_shape, first_frame)


# ---- 1x1x1 conv of a frame-major input (Wan 2.2's resnet shortcuts) -----------------------------------------
def pointwise_conv3d_reference(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """The replaced ops: `conv3d(pad(x, zeros), weight, bias)` (a causal conv whose pad is all zeros)."""
    return aten.conv3d.default(aten.pad.default(x, [0] * 6), weight, bias)
