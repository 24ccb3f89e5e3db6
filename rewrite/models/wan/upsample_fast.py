"""The Wan upsamplers' conv2d of a 2x nearest upsample at level ``channels_last`` (exactness class ``tolerance``),
computed by output phase: no upsampled tensor, 4/9 of the products.

A 3x3 conv (pad 1) of a 2x nearest upsample is, for each output phase ``(ph, pw)`` (every other row and column),
a 2x2 conv of the source whose taps sum the 3x3 taps that land on the same source pixel
(`triton_phase_weights.phase_weights`). Two ops run it, each taking the arguments of a ``lossless`` op
(`rewrite.models.wan.ops`) and returning its output's shape and layout (their fakes are that op's):

- `upsample_conv2d_fast` (Wan 2.1's upsamplers, replacing `rewrite::upsample_conv2d`): the four phases as four
  launches of the Triton conv over the source padded once by `padded_source`, bias added before the one
  rounding, each written into its strided view of the output. For the channel pairs `_TRITON_PHASES_FASTER`.
- `upsample_conv2d_dup_up_add_fast` (Wan 2.2's up-block ends, replacing `rewrite::upsample_conv2d_dup_up_add`):
  the four phases as one cuDNN conv with ``4 * O`` output channels (`phase_conv`: a 2x2 conv padded by 1, so
  its output position ``(i + ph, j + pw)`` holds phase ``(ph, pw)`` of source pixel ``(i, j)``), then one
  epilogue pass (`triton_epilogue.conv_epilogue` with ``phases``) that gathers each output pixel from its
  phase, adds the bias and the DupUp3D shortcut and writes the replaced add's layout, the pass the
  ``lossless`` op also runs. For the wide channel pairs `_CUDNN_PHASES_FASTER`, where cuDNN's wide GEMMs
  outrun the Triton conv.

Where a call is not served (the reason functions below; no kernel on this device; autograd) the replaced
``lossless`` op runs: its answer, never a wrong one.

Tolerance: the summed 2x2 taps are rounded once to the weight dtype (about one weight ulp each), and the
convs' fp32 sums run in another order than the 3x3 conv's (the ``channels_last`` contract, README; measured
in docs/results.md). The tables are H200 measurements: docs/tuning.md sections 1.11 and 1.12.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rewrite.kernels import layout
from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.epilogue import epilogue as triton_epilogue
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.kernels.conv3d import phase_weights as triton_phase_weights
from rewrite.models.wan import ops as _exact  # noqa: F401  (registers the replaced rewrite::upsample_conv2d* ops)
from rewrite.ops.dispatch import use_kernel

__all__ = ["dup_up_phases_reason", "padded_source", "phase_conv", "upsample_conv2d_dup_up_add_fast",
           "upsample_conv2d_fast", "upsample_reason"]

aten = torch.ops.aten
rewrite_ops = torch.ops.rewrite

# (in channels, out channels) of Wan's upsampler convs that the Triton phase kernels
# (`triton_conv3d.upsample2x_conv2d_channels_last`) ran faster on the H200 than the ``lossless`` op (the upsample
# kernel, cuDNN's conv of the upsampled frames, the bias epilogue): docs/tuning.md section 1.11.
_TRITON_PHASES_FASTER: frozenset = frozenset({(192, 96), (384, 192)})
# (in channels, out channels) of Wan 2.2's up-block end convs -> the smallest source frame (pixels) at which the
# cuDNN phase conv plus its gathering epilogue ran faster on the H200 than the ``lossless`` op (docs/tuning.md
# section 1.12: below these sizes cuDNN's 2x2 conv is slower on small frames).
_CUDNN_PHASES_FASTER: dict = {(1024, 1024): 90 * 160, (512, 512): 180 * 320}


def _conv_shape_reason(x_shape, weight_shape, stride, padding) -> Optional[str]:
    """None for a [N, C, H, W] x and a 3x3, unit-stride, pad-1 [O, C, 3, 3] weight; else what was expected."""
    if len(x_shape) != 4 or len(weight_shape) != 4 or x_shape[1] != weight_shape[1]:
        return f"expected [N, C, H, W] and [O, C, kh, kw], got {tuple(x_shape)} and {tuple(weight_shape)}"
    if tuple(weight_shape[2:]) != (3, 3) or list(stride) != [1, 1] or list(padding) != [1, 1]:
        return f"a {tuple(weight_shape[2:])} conv, stride {list(stride)}, padding {list(padding)} (3x3, 1, 1 served)"
    return None


def upsample_reason(x_shape, weight_shape, stride, padding, dtype: torch.dtype) -> Optional[str]:
    """None when `upsample_conv2d_fast`'s phase kernels serve the conv2d of the 2x-upsampled x (4-D, a 3x3 unit
    stride conv padded by 1, bf16/fp16, a channel pair measured faster); else why the ``lossless`` op runs it.
    Read by the pattern's guard on the graph's shapes and by the op on its tensors."""
    reason = _conv_shape_reason(x_shape, weight_shape, stride, padding)
    if reason is not None:
        return reason
    reason = triton_conv3d.unsupported_reason((x_shape[0], x_shape[1], 1, 2 * x_shape[2] + 2, 2 * x_shape[3] + 2),
                                              (weight_shape[0], weight_shape[1], 1, 2, 2), dtype)
    if reason is not None:
        return reason
    if (weight_shape[1], weight_shape[0]) not in _TRITON_PHASES_FASTER:
        return f"the phase kernels are not measured faster for {weight_shape[1]} -> {weight_shape[0]} channels"
    return None


def padded_source(x: Tensor) -> Tensor:
    """x [N, C, H, W] with a one-pixel zero border, channels-last (the phase kernels' input), in one pass: the
    pad kernel writes the frames as one clip [1, C, N, H + 2, W + 2] in NDHWC memory, which is that 4-D
    tensor's NHWC memory, instead of ATen's border fill plus a transposing copy."""
    clip = triton_pad.pad_channels_last(x.transpose(0, 1).unsqueeze(0), [1, 1, 1, 1, 0, 0])
    return clip.squeeze(0).transpose(0, 1)


@torch.library.custom_op("rewrite::upsample_conv2d_fast", mutates_args=())  # reads no channels-last weight copy
def upsample_conv2d_fast(x: Tensor, upcast: bool, weight: Tensor, bias: Optional[Tensor], stride: list[int],
                         padding: list[int]) -> Tensor:
    """`rewrite::upsample_conv2d` (the conv2d of x upsampled 2x, nearest) without the upsampled tensor: each of
    the four output phases is a 2x2 conv of x with summed weights (`triton_conv3d.upsample2x_conv2d_channels_last`,
    4/9 of the products), bias added before the one rounding, written into the layout the ``lossless`` op
    returns. Where `upsample_reason` declines (or no kernel runs on this device), the ``lossless`` op runs.
    Tolerance: the module docstring's."""
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if (upsample_reason(x.shape, weight.shape, stride, padding, x.dtype) is None
            and use_kernel("upsample_conv2d_fast", tensors, triton_conv3d.SUPPORTED_DTYPES)):
        shape = layout.upsample_conv2d_output_shape(x.shape, weight.shape, padding)
        out = layout.empty(shape, x, layout.suggest_memory_format(x))
        return triton_conv3d.upsample2x_conv2d_channels_last(padded_source(x), weight, bias, out)
    return rewrite_ops.upsample_conv2d.default(x, upcast, weight, bias, stride, padding)


@upsample_conv2d_fast.register_fake
def _(x, upcast, weight, bias, stride, padding):
    return layout.empty(layout.upsample_conv2d_output_shape(x.shape, weight.shape, padding), x,
                        layout.suggest_memory_format(x))


# ---- Wan 2.2's up-block end: the phases as one cuDNN conv, gathered by the DupUp epilogue -------------------
def dup_up_phases_reason(x_shape, weight_shape, stride, padding, dtype: torch.dtype) -> Optional[str]:
    """None when `upsample_conv2d_dup_up_add_fast`'s cuDNN phase conv serves the conv2d of the 2x-upsampled x
    (4-D, a 3x3 unit-stride conv padded by 1, bf16/fp16, a channel pair and frame size measured faster); else
    why the ``lossless`` op runs it. Read by the pattern's guard on the graph's shapes and by the op on its
    tensors."""
    reason = _conv_shape_reason(x_shape, weight_shape, stride, padding)
    if reason is not None:
        return reason
    if dtype not in triton_conv3d.SUPPORTED_DTYPES:
        return f"{dtype} keeps the lossless op (the summed taps are rounded to bf16/fp16 only)"
    smallest = _CUDNN_PHASES_FASTER.get((weight_shape[1], weight_shape[0]))
    if smallest is None:
        return f"the cuDNN phase conv is not measured faster for {weight_shape[1]} -> {weight_shape[0]} channels"
    pixels = x_shape[2] * x_shape[3]
    if isinstance(pixels, int) and pixels < smallest:  # a symbolic size is admitted: the op decides per call
        return (f"the cuDNN phase conv is measured faster for {weight_shape[1]} -> {weight_shape[0]} channels from "
                f"{smallest} source pixels a frame, not {pixels}")
    return None


def phase_conv(x: Tensor, weight: Tensor) -> Tensor:
    """cuDNN's conv of x [N, C, H, W] with the four phases' 2x2 kernels stacked as ``4 * O`` output channels
    (phase ``p = 2 * ph + pw`` in channels ``p * O``..), padded by one pixel, no bias: [N, 4 * O, H + 1, W + 1],
    channels-last, whose position ``(i + ph, j + pw)`` in phase p's channels is the conv of the 2x-upsampled x
    at output pixel ``(2i + ph, 2j + pw)``. A channels-last x is read where it lies (cuDNN pads); another layout
    is written once, padded, by `padded_source`."""
    stacked = triton_phase_weights.phase_weights(weight).flatten(0, 1)  # [4 * O, C, 2, 2], channels-last memory
    if x.is_contiguous(memory_format=torch.channels_last):
        return aten.conv2d.default(x, stacked, None, [1, 1], [1, 1])
    return aten.conv2d.default(padded_source(x), stacked, None, [1, 1], [0, 0])


@torch.library.custom_op("rewrite::upsample_conv2d_dup_up_add_fast", mutates_args=())  # reads no channels-last copy
def upsample_conv2d_dup_up_add_fast(x: Tensor, upcast: bool, weight: Tensor, bias: Optional[Tensor],
                                    stride: list[int], padding: list[int], frames_shape: list[int], dx: Tensor,
                                    repeats: int, unfold_shape: list[int], fold_shape: list[int],
                                    first_frame: int) -> Tensor:
    """`rewrite::upsample_conv2d_dup_up_add` (a Wan 2.2 up block's end: the upsampler's conv2d of x upsampled 2x,
    unfolded to [b, c, t, h, w] frames, plus the DupUp3D shortcut of `dx`) with the conv by phases: `phase_conv`,
    then one epilogue pass gathering the phases, adding the bias (its own rounding, as the ``lossless`` op) and
    the shortcut, into the ``lossless`` op's layout. Where `dup_up_phases_reason` declines (or no kernel runs on
    this device), the ``lossless`` op runs. Tolerance: the module docstring's."""
    tensors = tuple(t for t in (x, weight, bias, dx) if t is not None)
    if (dup_up_phases_reason(x.shape, weight.shape, stride, padding, x.dtype) is None
            and _exact.dup_up_epilogue_fits(x, frames_shape, dx, unfold_shape)
            and use_kernel("upsample_conv2d_dup_up_add_fast", tensors, triton_conv3d.SUPPORTED_DTYPES)):
        b, t = int(frames_shape[0]), int(frames_shape[1])
        strides = _exact.upsample_conv2d_dup_up_add_layout(x, upcast, weight, padding, b, t, dx, repeats,
                                                           unfold_shape, fold_shape, first_frame)
        y = phase_conv(x, weight)
        y5 = y.view(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4)
        dup_up = triton_epilogue.DupUp(dx, repeats, int(unfold_shape[2]), int(unfold_shape[3]), first_frame)
        return triton_epilogue.conv_epilogue(y5, bias, None, strides, dup_up=dup_up, phases=True)
    return rewrite_ops.upsample_conv2d_dup_up_add.default(x, upcast, weight, bias, stride, padding, frames_shape, dx,
                                                          repeats, unfold_shape, fold_shape, first_frame)


@upsample_conv2d_dup_up_add_fast.register_fake
def _(x, upcast, weight, bias, stride, padding, frames_shape, dx, repeats, unfold_shape, fold_shape, first_frame):
    return _exact.upsample_conv2d_dup_up_add_fake(x, weight, padding, frames_shape)
