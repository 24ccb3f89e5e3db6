"""The Wan causal conv3d of a narrow input (the encoder's first conv reads the video's 3 channels) at level
``channels_last`` (exactness class ``tolerance``): the Triton conv over the input widened with zero channels.

`causal_conv3d_fast` takes the arguments of `rewrite::causal_conv3d` (`rewrite.models.wan.ops`) and returns
outputs of the same shapes and layouts (its fake is that op's). Its kernel path: the causal pad kernel writes
the padded input channels-last with `WIDENED_CHANNELS` channels, the ones past x's zero, and the next cache
(x's channels, as the exact op's). Where a 3-wide kernel's columns fit (3 x C <= 16: the video's 3 channels) the
"folded" form writes each pixel's three columns side by side as 9 channels and the conv runs with a kernel 1
wide (a third of the MMA work of the "widened" form, which keeps the columns apart; `plan` picks the form the
card's table chooses). The conv weight is copied into a widened channels-last buffer the same way (so the op does
not declare `reads_channels_last_weight`: it converts no weight); the Triton
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


def _forms(in_shape, weight_shape, pad: Optional[list[int]]):
    """(form, the Triton conv's padded input shape, its weight shape) of each way to run this conv, preferred
    first: "folded" (a 3-wide kernel's columns folded into the input channels, where 3 x C fit in
    `WIDENED_CHANNELS` and the width pad is 1 each side, or not known yet: `pad` None), then "widened"."""
    batch, channels, frames, rows, columns = in_shape
    out_channels, _, kt, kh, kw = weight_shape
    forms = []
    if kw == 3 and kw * channels <= WIDENED_CHANNELS and (pad is None or pad[:2] == [1, 1]):
        forms.append(("folded", (batch, WIDENED_CHANNELS, frames, rows, columns - kw + 1),
                      (out_channels, WIDENED_CHANNELS, kt, kh, 1)))
    forms.append(("widened", (batch, WIDENED_CHANNELS, *in_shape[2:]),
                  (out_channels, WIDENED_CHANNELS, *weight_shape[2:])))
    return forms


def plan(in_shape, weight_shape, dtype: torch.dtype, device: Optional[torch.device] = None,
         pad: Optional[list[int]] = None) -> tuple[Optional[str], Optional[str]]:
    """(the form the kernel path runs this conv in, None), or (None, why the exact op runs it): fewer than
    `WIDENED_CHANNELS` input channels and the Triton conv chosen for one of `_forms`' convs
    (`wan_fast.conv_reason`, on `device`'s card)."""
    channels = weight_shape[1]
    if channels >= WIDENED_CHANNELS:
        return None, f"{channels} input channels (this op widens inputs of fewer than {WIDENED_CHANNELS})"
    reasons = []
    for form, conv_in_shape, conv_weight_shape in _forms(tuple(in_shape), tuple(weight_shape), pad):
        reason = wan_fast.conv_reason(conv_in_shape, conv_weight_shape, dtype, device)
        if reason is None:
            return form, None
        reasons.append(f"{form}: {reason}")
    return None, "; ".join(reasons)


def reason(in_shape, weight_shape, dtype: torch.dtype, device: Optional[torch.device] = None) -> Optional[str]:
    """None when the kernel path serves this conv (its padded input's shape [B, C, Tp, Hp, Wp], the weight's
    [O, C, kt, kh, kw], the dtype, the device) in some form (`plan`); else why the exact op runs it."""
    return plan(in_shape, weight_shape, dtype, device)[1]


def _widened_weight(weight: Tensor, folded: bool) -> Tensor:
    """The [O, C, kt, kh, kw] weight with zero input channels up to `WIDENED_CHANNELS`, channels-last; `folded`:
    its kw columns moved into the channels first ([O, kw * C, kt, kh, 1], channel k * C + c column k's c)."""
    out_channels, channels, kt, kh, kw = weight.shape
    if folded:
        weight = weight.permute(0, 4, 1, 2, 3).reshape(out_channels, kw * channels, kt, kh, 1)
    widened = torch.empty((out_channels, WIDENED_CHANNELS, *weight.shape[2:]), dtype=weight.dtype,
                          device=weight.device, memory_format=CL).zero_()
    widened[:, :weight.shape[1]].copy_(weight)
    return widened


@torch.library.custom_op("rewrite::causal_conv3d_fast", mutates_args=())  # reads no channels-last weight copy
def causal_conv3d_fast(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
                       bias: Optional[Tensor], residual: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """`rewrite::causal_conv3d` with the Triton conv over the zero-widened input (module docstring)."""
    args = (x, cache, pad, mode, weight, bias, residual)
    tensors = tuple(t for t in (x, cache, weight, bias, residual) if t is not None)
    if use_kernel("causal_conv3d_fast", tensors, triton_conv3d.SUPPORTED_DTYPES):
        in_shape = _exact.channels_last_conv_input_shape(x, cache, pad, mode, weight, residual)
        form = None if in_shape is None else plan(in_shape, tuple(weight.shape), x.dtype, x.device, list(pad))[0]
        if form is not None:
            source = cache if mode != "chunk0" else None
            if form == "folded":
                padded, next_cache = triton_pad.causal_pad_channels_last_folded(x, source, pad, weight.shape[4],
                                                                                WIDENED_CHANNELS)
            else:
                padded, next_cache = triton_pad.causal_pad_channels_last(x, source, pad, WIDENED_CHANNELS)
            shape = layout.conv_output_shape(in_shape, weight.shape)
            out = torch.empty_strided(shape, layout.conv_output_strides(shape, residual), dtype=x.dtype,
                                      device=x.device)
            triton_conv3d.conv3d_channels_last(padded, _widened_weight(weight, form == "folded"), bias, residual, out)
            return out, next_cache
    return rewrite_ops.causal_conv3d.default(*args)


@causal_conv3d_fast.register_fake
def _(x, cache, pad, mode, weight, bias, residual):
    return _exact._causal_conv3d_fake(x, cache, pad, mode, weight, bias, residual)
