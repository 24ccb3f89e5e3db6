"""The Wan RMS norm (+ SiLU) of level ``channels_last`` in one read of x, stored into a causal conv's padded
channels-last input and its next cache.

`rms_norm_padded_one_pass` returns what `rewrite.kernels.norm.rms_norm.rms_norm_padded_channels_last` returns (the
padded input ``[B, C, TO, HO, WO]`` and the next cache ``[B, C, 2, H, W]``, both channels-last; the pad
kernel `triton_pad.causal_pad_rest_channels_last` writes the cache frames and the zero pad), computed as::

    v = x (+ x_bias, rounded as ATen's add_ rounds it)
    y = v / max(||v||_2 over the channels, eps) * scale * gamma + bias    (then y * sigmoid(y) if silu)

One program holds every channel of its pixels in registers (a ``[channels padded to a power of two,
pixels]`` tile), so x is read once, where the exact kernel reads it twice to follow ATen's summation order
(`triton_norm`, level ``lossless``). Those two reads are most of what a norm costs at the Wan sizes (96
channels over 4 x 720 x 1280: 2 x 708 MB read, 720 MB written).

Exactness: ``tolerance`` (level ``channels_last`` only). The squares are summed in the tile's order in fp32
and the output is computed in fp32 and rounded once (ATen rounds after each op, `upcast` then moot): the
arithmetic (`normalized`) the pair op's fused norm epilogue (`triton_conv3d`) shares.

Preconditions (`one_pass_reason`): CUDA or the interpreter (the launcher runs anywhere Triton does), at most
`MAX_CHANNELS` channels (the tile's registers), x's (h, w) positions one strided run (contiguous planes or
channels-last rows).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from rewrite.ops.dispatch import triton
from rewrite.kernels.layout import run_stride
from rewrite.kernels.launch import launch
from rewrite.kernels.pad.causal_pad import causal_pad_rest_channels_last

__all__ = ["MAX_CHANNELS", "one_pass_reason", "rms_norm_padded_one_pass"]

MAX_CHANNELS = 1024  # [1024, 16] fp32 values per program: 64 registers a thread at 8 warps
TILE_VALUES = 8192  # channels (padded) x pixels per program, 16 pixels at least
WIDE_CHANNELS = 512  # past this many (padded) channels a program runs on 8 warps instead of 4


if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import round_to as _round

    @triton.jit
    def inverse_norm(norm, scale, eps):
        """`scale / max(norm, eps)` (clamp_min: NaN stays NaN), per pixel."""
        return scale / tl.where(norm < eps, eps, norm)

    @triton.jit
    def normalized(v, inv_norm, gamma, bias, SILU: tl.constexpr):
        """The Wan norm's affine part in fp32, `v * inv_norm * gamma + bias` (then SiLU), before its one rounding:
        the arithmetic of this module's kernel and of the conv's fused norm epilogue (`triton_conv3d`)."""
        y = v * inv_norm * gamma + bias
        if SILU:
            y = y * tl.sigmoid(y)
        return y

    @triton.jit
    def _norm_padded_one_pass_kernel(x_ptr, xb_ptr, gamma_ptr, out_ptr, next_ptr, C, T, HW, W, sx0, sx1, sx2, sxp,
                                     TO, HO, WO, FT, PH, PW, SLOT0, scale, bias, eps, SILU: tl.constexpr,
                                     HAS_XBIAS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
        """BLOCK_P pixels of plane (b, t) = program_id(0), every channel: frame t of x at padded frame FT + t,
        pixel (h, w) at (PH + h, PW + w) of the [B, TO, HO, WO, C] memory of the padded input; frames SLOT0 and
        SLOT0 + 1 also into the next cache ([B, 2, H, W, C] memory). x's (h, w) positions are one run of
        stride sxp."""
        plane = tl.program_id(0)
        b = (plane // T).to(tl.int64)
        t = (plane % T).to(tl.int64)
        hw = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
        c = tl.arange(0, BLOCK_C)
        cmask = c < C
        mask = cmask[:, None] & (hw < HW)[None, :]
        x = tl.load(x_ptr + (b * sx0 + t * sx2 + hw.to(tl.int64) * sxp)[None, :] + c[:, None].to(tl.int64) * sx1,
                    mask=mask, other=0.0)
        v = x.to(tl.float32)
        if HAS_XBIAS:  # x is a conv output whose bias was deferred: its value is x + bias, rounded
            v = _round(v + tl.load(xb_ptr + c, mask=cmask, other=0.0).to(tl.float32)[:, None], x.dtype)
            v = tl.where(mask, v.to(tl.float32), 0.0)
        inv_norm = inverse_norm(tl.sqrt(tl.sum(v * v, axis=0)), scale, eps)
        gamma = tl.load(gamma_ptr + c, mask=cmask, other=0.0).to(tl.float32)[:, None]
        y = _round(normalized(v, inv_norm[None, :], gamma, bias, SILU), x.dtype)
        h = (hw // W).to(tl.int64)
        w = (hw % W).to(tl.int64)
        channels = c[:, None].to(tl.int64)
        tl.store(out_ptr + ((((b * TO + FT + t) * HO + PH + h) * WO + PW + w) * C)[None, :] + channels, y,
                 mask=mask)
        slot = t - SLOT0
        if (slot >= 0) & (slot < 2):
            tl.store(next_ptr + ((((b * 2 + slot) * (HW // W) + h) * W + w) * C)[None, :] + channels, y, mask=mask)


def one_pass_reason(x: Tensor) -> Optional[str]:
    """None when `rms_norm_padded_one_pass` serves x, else why not."""
    if triton is None:
        return "triton is not importable"
    if x.dim() != 5:
        return f"x is {x.dim()}-D (a [B, C, T, H, W] tensor is needed)"
    if x.shape[1] > MAX_CHANNELS:
        return f"{x.shape[1]} channels (one program holds at most {MAX_CHANNELS})"
    if run_stride(x) is None:
        return f"x's (h, w) positions are not one strided run (strides {x.stride()})"
    return None


def rms_norm_padded_one_pass(x: Tensor, gamma: Tensor, scale: float, bias: float, eps: float, silu: bool,
                             cache: Optional[Tensor], pad: list[int], x_bias: Optional[Tensor] = None,
                             next_cache: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(padded channels-last conv input, next cache) of the module docstring; `cache` None for a first chunk;
    `next_cache`: the buffer the next cache is written into (`triton_pad.causal_pad_rest_channels_last`)."""
    reason = one_pass_reason(x)
    if reason is not None:
        raise ValueError(f"rms_norm_padded_one_pass: {reason}")
    if gamma.numel() != x.shape[1] or (x_bias is not None and x_bias.numel() != x.shape[1]):
        raise ValueError(f"rms_norm_padded_one_pass: gamma / x_bias must have {x.shape[1]} values, got "
                         f"{gamma.numel()} / {None if x_bias is None else x_bias.numel()}")
    out, next_cache = causal_pad_rest_channels_last(x, cache, pad, next_cache)
    if not out.numel() or not x.numel():
        return out, next_cache
    wl, _, hl, _, tl_, _ = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    _, _, frames_out, rows_out, columns_out = out.shape
    block_c = triton.next_power_of_2(c)
    block_p = max(16, min(128, TILE_VALUES // block_c))
    launch(_norm_padded_one_pass_kernel, (b * tx, triton.cdiv(h * w, block_p)), x, x if x_bias is None else x_bias,
           gamma, out, next_cache, c, tx, h * w, w, *x.stride()[:3], run_stride(x), frames_out, rows_out, columns_out,
           tl_ + tc, hl, wl, tx - 2, float(scale), float(bias), float(eps), SILU=silu, HAS_XBIAS=x_bias is not None,
           BLOCK_C=block_c, BLOCK_P=block_p, num_warps=8 if block_c > WIDE_CHANNELS else 4, exact=False)
    return out, next_cache
