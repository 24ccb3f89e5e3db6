"""The Wan encoder's spatial downsample as one op: a zero pad and a strided conv2d over the frames folded into the
batch (`WanResample` in ``downsample2d`` / ``downsample3d`` mode: ``ZeroPad2d((0, 1, 0, 1))`` and a 3x3 conv of
stride 2).

`rewrite::pad_conv2d(x, pad, weight, bias, stride)` is ``conv2d(pad(x, pad), weight, bias, stride)``. Kernel path
(CUDA, where `selftest.strided_channels_last_conv_is_exact` found cuDNN's channels-last conv of this shape and
stride `torch.equal` to its NCHW conv on the running device): the input is written once, padded, into
channels-last memory (ATen's strided copy; the reference pads into NCHW and cuDNN transposes it again), cuDNN
convolves it with the channels-last weight without bias, and `conv_epilogue` adds the bias with ATen's rounding
(ATen's cuDNN path adds it separately: docs/design.md section 6.5) while writing the layout the replaced conv
gives. Anywhere else the replaced ops run. Exactness: exact.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rewrite.kernels import layout
from rewrite.kernels.epilogue import epilogue as triton_epilogue
from rewrite.ops import selftest
from rewrite.ops.dispatch import use_kernel
from rewrite.ops.op_info import reads_channels_last_weight

aten = torch.ops.aten

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
    """``pad(x, pad)`` written once into channels-last memory: zero borders, the interior copied from x."""
    left, right, top, bottom = pad
    h, w = x.shape[2], x.shape[3]
    out = torch.empty(padded_shape(x.shape, pad), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    out[:, :, top: top + h, left: left + w].copy_(x)
    for rows, cols in ((slice(0, top), slice(None)), (slice(top + h, None), slice(None)),
                       (slice(top, top + h), slice(0, left)), (slice(top, top + h), slice(left + w, None))):
        out[:, :, rows, cols].zero_()
    return out


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
