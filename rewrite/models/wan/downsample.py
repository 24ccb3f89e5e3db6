"""The Wan encoder's downsamplers as ops (`WanResample` in ``downsample2d`` / ``downsample3d`` mode): the spatial
zero pad + strided conv2d over the frames folded into the batch (``ZeroPad2d((0, 1, 0, 1))``, a 3x3 conv of
stride 2), and the temporal `time_conv` of ``downsample3d``.

`rewrite::pad_conv2d(x, pad, weight, bias, stride)` is ``conv2d(pad(x, pad), weight, bias, stride)``. Kernel path
(CUDA, where `selftest.strided_channels_last_conv_is_exact` found cuDNN's channels-last conv of this shape and
stride `torch.equal` to its NCHW conv on the running device): the input is written once, padded, into
channels-last memory (the causal pad's Triton kernel; the reference pads into NCHW and cuDNN transposes it again), cuDNN
convolves it with the channels-last weight without bias, and `conv_epilogue` adds the bias with ATen's rounding
(ATen's cuDNN path adds it separately: docs/design.md section 6.5) while writing the layout the replaced conv
gives. Anywhere else the replaced ops run. Exactness: exact.

`rewrite::time_conv(x, cache, pad, weight, bias, stride) -> (y, next cache)` is the steady step's ``time_conv``:
``conv3d(pad(cat([cache[:, :, -1:], x], 2), pad), weight, bias, stride)`` (a 3x1x1 conv of stride 2 in time,
whose causal pad is all zeros) and the next cache ``x[:, :, -1:].clone()``. Kernel path, under the same kind
of self-check: the cached frame and x are written once into channels-last memory (the reference copies them
by `cat`, again by the pad and once more in cuDNN's transposes), cuDNN convolves them channels-last without
bias and `conv_epilogue` adds the bias. Exactness: exact.

`rewrite::avg_down_add(main, x, pad, unfold_shape, channels_shape, fold_shape)` is ``main + AvgDown3D(x)``, the end
of a Wan 2.2 `WanResidualDownBlock`: x padded by `pad_t` zero frames in front (`pad` = [0, 0, 0, 0, pad_t, 0]), each
(factor_t, factor_s, factor_s) block of positions unfolded into channels, each run of `group` unfolded channels
averaged (the three views' shapes give the factors), the result added to `main`.
Kernel path (CUDA, or the Triton interpreter in tests): `rewrite.kernels.downsample.avg_down` gathers each output's
values from x in one pass, where ATen runs a pad, a permuted copy, a mean and an add, in the order and with the
rounding points of ATen's CUDA mean and add. Exactness: exact.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rewrite.kernels import layout
from rewrite.kernels.downsample import avg_down as triton_avg_down
from rewrite.kernels.epilogue import epilogue as triton_epilogue
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.models.wan.ops import FLOAT_DTYPES
from rewrite.models.wan.reference import END
from rewrite.ops import selftest
from rewrite.ops.dispatch import use_kernel
from rewrite.ops.op_info import reads_channels_last_weight

aten = torch.ops.aten


def pad_conv2d_reference(x: Tensor, pad: list[int], weight: Tensor, bias: Optional[Tensor],
                         stride: list[int]) -> Tensor:
    """The replaced subgraph (the weight made contiguous: the runtime may pass a channels-last copy)."""
    return aten.conv2d.default(aten.pad.default(x, pad, "constant", 0.0), aten.contiguous.default(weight), bias,
                               stride)


def padded_shape(x_shape, pad: list[int]) -> tuple[int, ...]:
    """[n, c, h, w] padded by ``pad`` = (left, right, top, bottom), as `aten.pad` takes it for the last two dims."""
    left, right, top, bottom = pad
    n, c, h, w = x_shape
    return (n, c, h + top + bottom, w + left + right)


def _serves(x: Tensor, pad: list[int], weight: Tensor, stride: list[int]) -> bool:
    """Whether the channels-last path may serve: 4-D operands, a non-negative 4-entry pad, and a conv shape and
    stride the self-check found exact on this device."""
    if not (x.dim() == 4 and weight.dim() == 4 and len(pad) == 4 and min(pad) >= 0 and len(stride) == 2
            and weight.shape[1] == x.shape[1]):
        return False
    return selftest.strided_channels_last_conv_is_exact(padded_shape(x.shape, pad), tuple(weight.shape), tuple(stride),
                                                        x.dtype, x.device)


def _padded_channels_last(x: Tensor, pad: list[int]) -> Tensor:
    """``pad(x, pad)`` written once into channels-last memory by the causal pad's Triton kernel (x as one frame
    of a 5-D tensor: NDHWC memory of one frame is NHWC)."""
    return triton_pad.pad_channels_last(x.unsqueeze(2), [*pad, 0, 0]).squeeze(2)


@reads_channels_last_weight("weight")
@torch.library.custom_op("rewrite::pad_conv2d", mutates_args=())
def pad_conv2d(x: Tensor, pad: list[int], weight: Tensor, bias: Optional[Tensor], stride: list[int]) -> Tensor:
    """``conv2d(pad(x, pad), weight, bias, stride)`` (module docstring)."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if use_kernel("pad_conv2d", tensors, FLOAT_DTYPES) and _serves(x, pad, weight, stride):
        strides = layout.reference_layout(("pad_conv2d", tuple(pad), tuple(stride)),
                                          lambda a, wt: pad_conv2d_reference(a, pad, wt, None, stride), x, weight)
        y = aten.conv2d.default(_padded_channels_last(x, pad), weight.contiguous(memory_format=torch.channels_last),
                                None, stride)
        out = triton_epilogue.conv_epilogue(y.unsqueeze(2), bias, None, (strides[0], strides[1], 0, *strides[2:]))
        return out.squeeze(2)
    return pad_conv2d_reference(x, pad, weight, bias, stride)


@pad_conv2d.register_fake
def _(x, pad, weight, bias, stride):
    return pad_conv2d_reference(x, pad, weight, bias, stride)


# ---- time_conv: the temporal downsample of downsample3d ----------------------------------------------------------
def time_conv_reference(x: Tensor, cache: Tensor, pad: list[int], weight: Tensor, bias: Optional[Tensor],
                        stride: list[int]) -> tuple[Tensor, Tensor]:
    """The replaced subgraph: (the conv of the last cached frame and x, the next cache)."""
    joined = aten.cat.default([aten.slice.Tensor(cache, 2, -1, END), x], 2)
    y = aten.conv3d.default(aten.pad.default(joined, pad), aten.contiguous.default(weight), bias, stride)
    return y, aten.clone.default(aten.slice.Tensor(x, 2, -1, END))


def _time_conv_serves(x: Tensor, cache: Tensor, pad: list[int], weight: Tensor, stride: list[int]) -> bool:
    """Whether the channels-last path may serve: 5-D operands of one dtype, an all-zero pad, and a conv shape and
    stride the self-check found exact on this device."""
    if not (x.dim() == 5 and cache.dim() == 5 and weight.dim() == 5 and cache.dtype == x.dtype and not any(pad)
            and len(stride) == 3 and weight.shape[1] == x.shape[1] and cache.shape[1] == x.shape[1]):
        return False
    b, c, t, h, w = x.shape
    return selftest.strided_channels_last_conv_is_exact((b, c, t + 1, h, w), tuple(weight.shape), tuple(stride),
                                                        x.dtype, x.device)


def _joined_channels_last(x: Tensor, cache: Tensor) -> Tensor:
    """``cat([cache[:, :, -1:], x], 2)`` written once into channels-last memory by the causal pad's Triton kernel."""
    return triton_pad.pad_channels_last(x, [0] * 6, cache[:, :, -1:])


@reads_channels_last_weight("weight")
@torch.library.custom_op("rewrite::time_conv", mutates_args=())
def time_conv(x: Tensor, cache: Tensor, pad: list[int], weight: Tensor, bias: Optional[Tensor],
              stride: list[int]) -> tuple[Tensor, Tensor]:
    """(the steady step's `time_conv` output, its next cache) (module docstring)."""
    tensors = (x, cache, weight) if bias is None else (x, cache, weight, bias)
    if use_kernel("time_conv", tensors, FLOAT_DTYPES) and _time_conv_serves(x, cache, pad, weight, stride):
        strides = layout.reference_layout(("time_conv", tuple(pad), tuple(stride)),
                                          lambda a, c, wt: time_conv_reference(a, c, pad, wt, None, stride)[0],
                                          x, cache, weight)
        y = aten.conv3d.default(_joined_channels_last(x, cache), weight.contiguous(memory_format=torch.channels_last_3d),
                                None, stride)
        return (triton_epilogue.conv_epilogue(y, bias, None, strides),
                aten.clone.default(aten.slice.Tensor(x, 2, -1, END)))
    return time_conv_reference(x, cache, pad, weight, bias, stride)


@time_conv.register_fake
def _(x, cache, pad, weight, bias, stride):
    return time_conv_reference(x, cache, pad, weight, bias, stride)


# ---- Wan 2.2's AvgDown3D shortcut and the down block's residual add ----------------------------------------------
def avg_down_add_reference(main: Tensor, x: Tensor, pad: list[int], unfold_shape: list[int], channels_shape: list[int],
                           fold_shape: list[int]) -> Tensor:
    """The replaced subgraph, as diffusers' `AvgDown3D.forward` and the block's add run it (`pad` all zeros: the
    graph had no pad, or a pad by nothing)."""
    if any(pad):
        x = aten.pad.default(x, pad, "constant", 0.0)
    unfolded = aten.contiguous.default(aten.permute.default(aten.view.default(x, unfold_shape),
                                                            [0, 1, 3, 5, 7, 2, 4, 6]))
    grouped = aten.view.default(aten.view.default(unfolded, channels_shape), fold_shape)
    return aten.add.Tensor(main, aten.mean.dim(grouped, [2]))


def avg_down_factors(pad: list[int], unfold_shape: list[int], fold_shape: list[int]) -> tuple[int, int, int, int]:
    """(pad_t, factor_t, factor_s, group) of the shortcut's pad, unfold view [B, C, T/ft, ft, H/fs, fs, W/fs, fs]
    and group view [B, O, group, T/ft, H/fs, W/fs]."""
    return int(pad[4]), int(unfold_shape[3]), int(unfold_shape[5]), int(fold_shape[2])


@torch.library.custom_op("rewrite::avg_down_add", mutates_args=())
def avg_down_add(main: Tensor, x: Tensor, pad: list[int], unfold_shape: list[int], channels_shape: list[int],
                 fold_shape: list[int]) -> Tensor:
    """``main + AvgDown3D(x)`` (module docstring)."""
    factors = avg_down_factors(pad, unfold_shape, fold_shape)
    if (main.dtype == x.dtype and use_kernel("avg_down_add", (main, x), FLOAT_DTYPES)
            and triton_avg_down.avg_down_add_reason(main.shape, x.shape, *factors) is None):
        return triton_avg_down.avg_down_add(main, x, *factors)
    return avg_down_add_reference(main, x, pad, unfold_shape, channels_shape, fold_shape)


@avg_down_add.register_fake
def _(main, x, pad, unfold_shape, channels_shape, fold_shape):
    return torch.empty_like(main)  # ATen's add of main and the mean's contiguous output takes main's layout
