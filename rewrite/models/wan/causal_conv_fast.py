"""The Wan causal conv3d of a narrow input (the encoder's first conv reads the video's 3 channels) at level
``channels_last`` (exactness class ``tolerance``): the Triton conv over the input widened with zero channels.

`causal_conv3d_fast` takes the arguments of `rewrite::causal_conv3d` (`rewrite.models.wan.ops`) and returns
outputs of the same shapes and layouts (its fake is that op's). Its kernel path: the causal pad kernel writes
the padded input channels-last with `WIDENED_CHANNELS` channels, the ones past x's zero, and the next cache
(x's channels, as the exact op's); the conv weight is copied into a widened channels-last buffer with zero input
channels (so the op does not declare `reads_channels_last_weight`: it converts no weight); the Triton
conv (`rewrite.kernels.conv3d.conv3d`) adds bias and residual to its fp32 sum before the one rounding. The zero
channels add exact zeros, so the result is the conv of the narrow input summed in the Triton conv's order.

Why: cuDNN runs a 3-channel bf16 conv3d with a generic kernel (`implicit_convolveNd_sgemm`, about 4.9 ms a
4-frame 720p chunk on an H100, docs/data/profiles/encode_wan21_720x1280x21_off_vs_lossless_h100.log), and the
Triton conv needs a multiple of 16 input channels (TMA rows of 32 bytes, the MMA's K).

Where the kernel path does not serve (not bf16/fp16, autograd, a shape the Triton conv or the channels-last
path declines, a card whose table does not choose it: `reason`), the op runs `rewrite::causal_conv3d`, the
``lossless`` answer.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rewrite.kernels import layout
from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.models.wan import ops as _exact  # registers rewrite::causal_conv3d
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.ops.dispatch import use_kernel

__all__ = ["WIDENED_CHANNELS", "causal_conv3d_fast", "reason"]

rewrite_ops = torch.ops.rewrite
CL = torch.channels_last_3d
WIDENED_CHANNELS = 16  # the Triton conv's smallest input channel count


def reason(in_shape, weight_shape, dtype: torch.dtype, device: Optional[torch.device] = None) -> Optional[str]:
    """None when the kernel path serves this conv (its padded input's shape [B, C, Tp, Hp, Wp], the weight's
    [O, C, kt, kh, kw], the dtype, the device): fewer than `WIDENED_CHANNELS` input channels and the Triton conv
    chosen for the widened conv (`wan_fast.conv_reason`); else why the exact op runs it."""
    channels = weight_shape[1]
    if channels >= WIDENED_CHANNELS:
        return f"{channels} input channels (this op widens inputs of fewer than {WIDENED_CHANNELS})"
    widened = (in_shape[0], WIDENED_CHANNELS, *in_shape[2:])
    return wan_fast.conv_reason(widened, (weight_shape[0], WIDENED_CHANNELS, *weight_shape[2:]), dtype, device)


def _widened_weight(weight: Tensor) -> Tensor:
    """The [O, C, kt, kh, kw] weight with zero input channels up to `WIDENED_CHANNELS`, channels-last."""
    out_channels, channels, *kernel = weight.shape
    widened = torch.empty((out_channels, WIDENED_CHANNELS, *kernel), dtype=weight.dtype, device=weight.device,
                          memory_format=CL).zero_()
    widened[:, :channels].copy_(weight)
    return widened


@torch.library.custom_op("rewrite::causal_conv3d_fast", mutates_args=())  # reads no channels-last weight copy
def causal_conv3d_fast(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
                       bias: Optional[Tensor], residual: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """`rewrite::causal_conv3d` with the Triton conv over the zero-widened input (module docstring)."""
    args = (x, cache, pad, mode, weight, bias, residual)
    tensors = tuple(t for t in (x, cache, weight, bias, residual) if t is not None)
    if use_kernel("causal_conv3d_fast", tensors, triton_conv3d.SUPPORTED_DTYPES):
        in_shape = _exact.channels_last_conv_input_shape(x, cache, pad, mode, weight, residual)
        if in_shape is not None and reason(in_shape, tuple(weight.shape), x.dtype, x.device) is None:
            padded, next_cache = triton_pad.causal_pad_channels_last(x, cache if mode != "chunk0" else None, pad,
                                                                     out_channels=WIDENED_CHANNELS)
            shape = layout.conv_output_shape(in_shape, weight.shape)
            out = torch.empty_strided(shape, layout.conv_output_strides(shape, residual), dtype=x.dtype,
                                      device=x.device)
            triton_conv3d.conv3d_channels_last(padded, _widened_weight(weight), bias, residual, out)
            return out, next_cache
    return rewrite_ops.causal_conv3d.default(*args)


@causal_conv3d_fast.register_fake
def _(x, cache, pad, mode, weight, bias, residual):
    return _exact._causal_conv3d_fake(x, cache, pad, mode, weight, bias, residual)
