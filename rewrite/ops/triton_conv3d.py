"""A dense conv3d over a pre-padded channels-last input, as one Triton implicit-GEMM kernel (Hopper: TMA loads).

Computes, for ``padded`` ``[B, C, Tp, Hp, Wp]`` in channels-last memory (NDHWC; the causal and spatial zero
pad already in it, as `triton_pad.causal_pad_channels_last` and `triton_norm.rms_norm_padded_channels_last`
write it) and a channels-last ``weight`` ``[O, C, kt, kh, kw]``::

    out[b, o, t, h, w] = sum_{i, j, k, c} weight[o, c, i, j, k] * padded[b, c, t + i, h + j, w + k]
                         (+ bias[o]) (+ residual[b, o, t, h, w] (+ residual_bias[o]))

i.e. ``conv3d(padded, weight, bias) + residual`` (unit stride, no padding), written into an output of any
strides the caller allocates (the layout the replaced subgraph had, or channels-last for a raw conv output
that another fused op reads). The Wan ``channels_last`` level runs its 3x3x3 causal convs here where the
`chosen` table says this kernel beats cuDNN's (docs/tuning.md section 1).

Kernel: one program computes ``BLOCK_M`` consecutive output pixels of one output row ``(b, t, h)`` by
``BLOCK_N`` output channels (or by 64 + 32 for 96 channels: two accumulators, so no MMA work is spent on
padding channels). For each tap ``(i, j, k)`` the input pixels of that row are ``BLOCK_M`` consecutive rows
of the ``[B*Tp*Hp*Wp, C]`` view of ``padded``, so a TMA descriptor loads the ``[BLOCK_M, BLOCK_K]`` operand
tile directly (rows past the row end are other pixels or zero fill: their outputs are masked at the store);
the weight tile ``[BLOCK_N, BLOCK_K]`` is a TMA load of the ``[O, kt*kh*kw*C]`` view of the channels-last
weight (K-major, the layout the tensor cores read). The reduction runs tap by tap, channel block by channel
block, in fp32; bias, the residual and its deferred bias are added to the fp32 accumulator and the sum is
rounded once to the activation dtype.

Norm epilogue (`conv3d_channels_last_norm_padded`, the pair op of `rewrite.ops.wan_fast`): where one program
holds every output channel of its pixels (the 64 + 32 split, or one channel block), it adds the bias, rounds
once, takes the Wan RMS norm over the channels (gamma, scale, SiLU) in fp32 with one rounding, and stores
the result straight into the next causal conv's padded channels-last input and
next cache, so the conv's own output is never written.

Exactness: ``tolerance`` (level ``channels_last`` only). bf16/fp16 products are exact in fp32; the sum runs in
another order than cuDNN's, and bias and residual are added before the one rounding (cuDNN + ATen round
the conv, then the bias add, then the residual add): differences of about one output ulp. fp32 is not served
(`unsupported_reason`): cuDNN's TF32 conv stays.

Preconditions (`unsupported_reason`): Triton with tensor descriptors, bf16/fp16 for every tensor, C a multiple
of 16, O >= 16, the input and weight channels-last with 16-byte aligned rows.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.ops.dispatch import INTERPRETING, triton
from rewrite.ops.triton_launch import launch

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton before host tensor descriptors
    TensorDescriptor = None

__all__ = ["ConvTile", "SUPPORTED_DTYPES", "chosen", "conv3d_channels_last", "conv3d_channels_last_norm_padded",
           "launch_config", "norm_epilogue_reason", "unsupported_reason"]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
MIN_OUT_CHANNELS = 16  # the smallest tensor-core tile side


class ConvTile(NamedTuple):
    """A launch configuration: `block_m` output pixels x `block_n` output channels per program (`split96`: 64 +
    32 channels in two accumulators), `block_k` input channels per step, `warps`, pipeline `stages`,
    `warp_specialize` (Triton's warp-specialized loop: producer warps issue the TMA loads)."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    split96: bool = False
    warp_specialize: bool = False


def _block_k(channels: int) -> int:
    return 64 if channels % 64 == 0 else 32 if channels % 32 == 0 else 16


def launch_config(in_channels: int, out_channels: int) -> ConvTile:
    """The tile for a conv with these channel counts (docs/tuning.md section 1: the H200 sweep)."""
    if out_channels == 96:
        return ConvTile(256, 64, _block_k(in_channels), 8, 4, split96=True)
    block_n = min(128, triton.next_power_of_2(out_channels)) if triton is not None else 128
    return ConvTile(128, block_n, _block_k(in_channels), 4, 4)


# (in channels, out channels, kernel taps) of the convs this kernel measured faster than cuDNN's on the H200
# (bf16, docs/tuning.md section 1); everything else keeps cuDNN's conv.
_FASTER_THAN_CUDNN = frozenset({(96, 96, 27)})


def chosen(in_channels: int, out_channels: int, taps: int) -> bool:
    """Whether the Wan ``channels_last`` ops run this kernel (else cuDNN's conv) for the conv shape."""
    return (in_channels, out_channels, taps) in _FASTER_THAN_CUDNN


def unsupported_reason(in_shape, weight_shape, dtype: torch.dtype) -> Optional[str]:
    """None when `conv3d_channels_last` serves a padded input of `in_shape` ([B, C, Tp, Hp, Wp]) and a
    weight of `weight_shape` ([O, C, kt, kh, kw]) in `dtype`, else why not (the caller keeps cuDNN's conv)."""
    if triton is None or TensorDescriptor is None:
        return "triton with tensor descriptors is not importable"
    if len(in_shape) != 5 or len(weight_shape) != 5 or in_shape[1] != weight_shape[1]:
        return f"expected [B, C, T, H, W] and [O, C, kt, kh, kw], got {tuple(in_shape)} and {tuple(weight_shape)}"
    if dtype not in SUPPORTED_DTYPES:
        return f"dtype {dtype} (the Triton conv3d serves {SUPPORTED_DTYPES}; fp32 keeps cuDNN's TF32 conv)"
    out_channels, in_channels = weight_shape[0], weight_shape[1]
    if in_channels % 16:
        return f"{in_channels} input channels (a multiple of 16 is needed)"
    if out_channels < MIN_OUT_CHANNELS or out_channels % 8:
        return f"{out_channels} output channels (16 or more, a multiple of 8, are needed)"
    if any(s < k for s, k in zip(in_shape[2:], weight_shape[2:])):
        return f"input {tuple(in_shape[2:])} is smaller than the kernel {tuple(weight_shape[2:])}"
    return None


if triton is not None:
    import triton.language as tl

    from rewrite.ops.triton_math import round_to as _round

    # The CPU interpreter multiplies bf16 tiles as their raw bits: there the operands go through fp32 (exact).
    _INTERPRET = tl.constexpr(INTERPRETING)

    @triton.jit
    def _dot(a, b, acc):
        if _INTERPRET:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            return tl.dot(a, b, acc)

    @triton.jit
    def _offsets(w, n, s_w, s_n, WIDE: tl.constexpr):
        """The [BLOCK_M, BLOCK_N] in-row offsets of pixels w and channels n: int32 unless WIDE (an offset within
        one output row reaches 2^31); the row's own offset is one int64 scalar added to the base pointer."""
        if WIDE:
            return w.to(tl.int64)[:, None] * s_w + n.to(tl.int64)[None, :] * s_n
        else:
            return w[:, None] * s_w + n[None, :] * s_n

    @triton.jit
    def _epilogue(acc, n0, w, out_row, res_row, bias_ptr, rb_ptr, C_OUT, W_OUT, so1, so4, sr1, sr4,
                  HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_RES_BIAS: tl.constexpr,
                  BLOCK_N: tl.constexpr, WIDE: tl.constexpr):
        """Add bias / residual (+ its deferred bias) to the fp32 tile of channels n0.. and store it rounded once
        (`out_row` / `res_row`: the output / residual pointers advanced to the program's row)."""
        n = n0 + tl.arange(0, BLOCK_N)
        mask = (w < W_OUT)[:, None] & (n < C_OUT)[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + n, mask=n < C_OUT, other=0.0).to(tl.float32)[None, :]
        if HAS_RESIDUAL:
            r = tl.load(res_row + _offsets(w, n, sr4, sr1, WIDE), mask=mask, other=0.0).to(tl.float32)
            if HAS_RES_BIAS:
                r += tl.load(rb_ptr + n, mask=n < C_OUT, other=0.0).to(tl.float32)[None, :]
            acc += r
        tl.store(out_row + _offsets(w, n, so4, so1, WIDE), _round(acc, out_row.dtype.element_ty), mask=mask)

    @triton.jit
    def _biased(acc, n0, bias_ptr, C_OUT, dtype: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
        """The conv output of channels n0.. rounded once to the activation dtype, its bias added first."""
        n = n0 + tl.arange(0, BLOCK_N)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + n, mask=n < C_OUT, other=0.0).to(tl.float32)[None, :]
        return _round(acc, dtype)

    @triton.jit
    def _store_normalized(y, n0, inv_norm, w, pad_row, next_row, IN_CACHE, gamma_ptr, C_OUT, W_OUT, nbias,
                          SILU: tl.constexpr, BLOCK_N: tl.constexpr):
        """The Wan norm (+ SiLU) of the tile y (channels n0..; `inv_norm` = scale / its pixels' clamped channel
        norms) in fp32, rounded once and stored into the next conv's padded input row (and, IN_CACHE, the next
        cache's row): both channels-last."""
        n = n0 + tl.arange(0, BLOCK_N)
        gamma = tl.load(gamma_ptr + n, mask=n < C_OUT, other=0.0).to(tl.float32)[None, :]
        v = y.to(tl.float32) * inv_norm * gamma + nbias
        if SILU:
            v = v * tl.sigmoid(v)
        v = _round(v, y.dtype)
        mask = (w < W_OUT)[:, None] & (n < C_OUT)[None, :]
        offsets = w[:, None] * C_OUT + n[None, :]
        tl.store(pad_row + offsets, v, mask=mask)
        if IN_CACHE:
            tl.store(next_row + offsets, v, mask=mask)

    @triton.jit
    def _conv3d_kernel(a_desc, w_desc, w2_desc, bias_ptr, res_ptr, rb_ptr, out_ptr, gamma_ptr, next_ptr, C_OUT, T_OUT,
                       H_OUT, W_OUT, TP, HP, WP, so0, so1, so2, so3, so4, sr0, sr1, sr2, sr3, sr4, TO, HO, WO, FT, PH,
                       PW, SLOT0, scale, nbias, eps, C_IN: tl.constexpr, KT: tl.constexpr, KH: tl.constexpr,
                       KW: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       HAS_RES_BIAS: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr,
                       SPLIT96: tl.constexpr, WIDE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, STAGES: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
        """One program: BLOCK_M output pixels of row (b, t, h) by BLOCK_N channels (SPLIT96: channels 0-63 and
        64-95 in two accumulators, `w2_desc` the second's weight tile). NORM: the program holds every output
        channel; it normalizes them into the next conv's padded input instead of storing them (module
        docstring)."""
        pid_w = tl.program_id(0)
        row = tl.program_id(1)
        n0 = tl.program_id(2) * BLOCK_N
        h = row % H_OUT
        t = (row // H_OUT) % T_OUT
        b = row // (H_OUT * T_OUT)
        w0 = pid_w * BLOCK_M
        blocks: tl.constexpr = C_IN // BLOCK_K
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if SPLIT96:
            acc2 = tl.zeros((BLOCK_M, 32), dtype=tl.float32)
        for step in tl.range(0, KT * KH * KW * blocks, num_stages=STAGES, warp_specialize=WARP_SPECIALIZE):
            tap = step // blocks
            c0 = (step % blocks) * BLOCK_K
            i = tap // (KH * KW)
            j = (tap // KW) % KH
            k = tap % KW
            a = a_desc.load([((b * TP + t + i) * HP + h + j) * WP + w0 + k, c0])
            wt = w_desc.load([n0, tap * C_IN + c0])
            acc = _dot(a, wt.T, acc)
            if SPLIT96:
                wt2 = w2_desc.load([64, tap * C_IN + c0])
                acc2 = _dot(a, wt2.T, acc2)
        b64 = b.to(tl.int64)
        t64 = t.to(tl.int64)
        h64 = h.to(tl.int64)
        w = w0 + tl.arange(0, BLOCK_M)
        if NORM:
            dtype: tl.constexpr = out_ptr.dtype.element_ty
            y = _biased(acc, n0, bias_ptr, C_OUT, dtype, HAS_BIAS, BLOCK_N)
            yf = y.to(tl.float32)
            squares = tl.sum(yf * yf, axis=1)
            if SPLIT96:
                y2 = _biased(acc2, 64, bias_ptr, C_OUT, dtype, HAS_BIAS, 32)
                y2f = y2.to(tl.float32)
                squares += tl.sum(y2f * y2f, axis=1)
            norm = tl.sqrt(squares)
            inv_norm = (scale / tl.where(norm < eps, eps, norm))[:, None]  # clamp_min: NaN stays NaN
            pad_row = out_ptr + (((b64 * TO + FT + t64) * HO + PH + h64) * WO + PW) * C_OUT
            slot = t64 - SLOT0
            in_cache = (slot >= 0) & (slot < 2)
            next_row = next_ptr + ((b64 * 2 + slot) * H_OUT + h64) * W_OUT * C_OUT
            _store_normalized(y, n0, inv_norm, w, pad_row, next_row, in_cache, gamma_ptr, C_OUT, W_OUT, nbias, SILU,
                              BLOCK_N)
            if SPLIT96:
                _store_normalized(y2, 64, inv_norm, w, pad_row, next_row, in_cache, gamma_ptr, C_OUT, W_OUT, nbias,
                                  SILU, 32)
        else:
            out_row = out_ptr + (b64 * so0 + t64 * so2 + h64 * so3)
            res_row = res_ptr + (b64 * sr0 + t64 * sr2 + h64 * sr3)
            _epilogue(acc, n0, w, out_row, res_row, bias_ptr, rb_ptr, C_OUT, W_OUT, so1, so4, sr1, sr4, HAS_BIAS,
                      HAS_RESIDUAL, HAS_RES_BIAS, BLOCK_N, WIDE)
            if SPLIT96:
                _epilogue(acc2, 64, w, out_row, res_row, bias_ptr, rb_ptr, C_OUT, W_OUT, so1, so4, sr1, sr4,
                          HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, 32, WIDE)


def _checked_shapes(padded: Tensor, weight: Tensor, bias: Optional[Tensor]) -> tuple[int, ...]:
    """The unpadded conv's output shape [B, O, T, H, W] after the argument checks every launcher shares."""
    reason = unsupported_reason(padded.shape, weight.shape, padded.dtype)
    if reason is not None:
        raise ValueError(f"conv3d_channels_last: {reason}")
    cl = torch.channels_last_3d
    if not (padded.is_contiguous(memory_format=cl) and weight.is_contiguous(memory_format=cl)):
        raise ValueError("conv3d_channels_last: padded input and weight must be channels-last (NDHWC) contiguous")
    batch, _, tp, hp, wp = padded.shape
    out_channels, _, kt, kh, kw = weight.shape
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise ValueError(f"conv3d_channels_last: bias must be [{out_channels}], got {tuple(bias.shape)}")
    return batch, out_channels, tp - kt + 1, hp - kh + 1, wp - kw + 1


def _row_offsets_wide(shape: tuple[int, ...], *strides: tuple[int, ...]) -> bool:
    """Whether an offset within one output row (w, channel) of a tensor of these strides reaches 2^31."""
    return any((shape[4] - 1) * abs(s[4]) + (shape[1] - 1) * abs(s[1]) >= 2 ** 31 for s in strides)


def _launch(padded: Tensor, weight: Tensor, tile: ConvTile, shape: tuple[int, ...], bias: Optional[Tensor],
            out: Tensor, out_strides: tuple[int, ...], residual: Optional[Tensor], residual_bias: Optional[Tensor],
            norm: Optional[tuple] = None, wide: bool = False) -> None:
    """One `_conv3d_kernel` launch; `norm`: (gamma, next_cache, (TO, HO, WO, FT, PH, PW, SLOT0), scale, bias,
    eps, silu) of the NORM epilogue, `out` then the next conv's padded input."""
    batch, channels, tp, hp, wp = padded.shape
    out_channels, _, kt, kh, kw = weight.shape
    if tile.split96 and (out_channels != 96 or tile.block_n != 64):
        raise ValueError(f"conv3d_channels_last: split96 tiles are for 96 output channels, got {out_channels}")
    a2d = padded.permute(0, 2, 3, 4, 1).reshape(batch * tp * hp * wp, channels)  # views of NDHWC memory
    w2d = weight.permute(0, 2, 3, 4, 1).reshape(out_channels, kt * kh * kw * channels)
    a_desc = TensorDescriptor.from_tensor(a2d, [tile.block_m, tile.block_k])
    w_desc = TensorDescriptor.from_tensor(w2d, [tile.block_n, tile.block_k])
    w2_desc = TensorDescriptor.from_tensor(w2d, [32, tile.block_k]) if tile.split96 else w_desc
    grid = (triton.cdiv(shape[4], tile.block_m), batch * shape[2] * shape[3],
            1 if tile.split96 else triton.cdiv(out_channels, tile.block_n))
    res = residual if residual is not None else out
    if norm is None:
        gamma, next_cache, geometry, scale, norm_bias, eps, silu = out, out, (0,) * 7, 1.0, 0.0, 0.0, False
    else:
        gamma, next_cache, geometry, scale, norm_bias, eps, silu = norm
    launch(_conv3d_kernel, grid, a_desc, w_desc, w2_desc, bias if bias is not None else out, res,
           residual_bias if residual_bias is not None else out, out, gamma, next_cache, out_channels, shape[2],
           shape[3], shape[4], tp, hp, wp, *out_strides, *res.stride(), *geometry, float(scale), float(norm_bias),
           float(eps), C_IN=channels, KT=kt, KH=kh, KW=kw, HAS_BIAS=bias is not None,
           HAS_RESIDUAL=residual is not None, HAS_RES_BIAS=residual_bias is not None, NORM=norm is not None,
           SILU=silu, SPLIT96=tile.split96, WIDE=wide, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
           BLOCK_K=tile.block_k, STAGES=tile.stages, WARP_SPECIALIZE=tile.warp_specialize, num_warps=tile.warps,
           exact=False)


def conv3d_channels_last(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                         out: Tensor, residual_bias: Optional[Tensor] = None,
                         config: Optional[ConvTile] = None) -> Tensor:
    """``conv3d(padded, weight, bias) (+ residual (+ residual_bias))`` into `out` (any strides, shape
    [B, O, T, H, W] of the unpadded conv) by the kernel of the module docstring; returns `out`. `padded` and
    `weight` must be channels-last (NDHWC) and contiguous in that order; `config` overrides `launch_config`."""
    shape = _checked_shapes(padded, weight, bias)
    out_channels = shape[1]
    if tuple(out.shape) != shape or out.dtype != padded.dtype:
        raise ValueError(f"conv3d_channels_last: out must be {shape} {padded.dtype}, got {tuple(out.shape)} {out.dtype}")
    if residual_bias is not None and tuple(residual_bias.shape) != (out_channels,):
        raise ValueError(f"conv3d_channels_last: residual_bias must be [{out_channels}], got {tuple(residual_bias.shape)}")
    if residual is not None and tuple(residual.shape) != shape:
        raise ValueError(f"conv3d_channels_last: residual must be {shape}, got {tuple(residual.shape)}")
    if out.numel() == 0:
        return out
    tile = config or launch_config(padded.shape[1], out_channels)
    strides = [out.stride()] + ([residual.stride()] if residual is not None else [])
    _launch(padded, weight, tile, shape, bias, out, out.stride(), residual, residual_bias,
            wide=_row_offsets_wide(shape, *strides))
    return out


def norm_epilogue_reason(out_channels: int, tile: ConvTile) -> Optional[str]:
    """None when one program of `tile` holds every output channel (the NORM epilogue's precondition)."""
    if tile.split96 or tile.block_n >= out_channels:
        return None
    return f"{out_channels} output channels span several programs of a {tile.block_n}-channel tile"


def conv3d_channels_last_norm_padded(padded: Tensor, weight: Tensor, bias: Optional[Tensor], gamma: Tensor,
                                     scale: float, norm_bias: float, eps: float, silu: bool,
                                     next_padded: Tensor, next_cache: Tensor, pad: list[int], cache_frames: int,
                                     config: Optional[ConvTile] = None) -> None:
    """``y = conv3d(padded, weight, bias)`` rounded once, then the Wan RMS norm of y over its channels,
    ``y / max(||y||, eps) * scale * gamma + norm_bias`` (SiLU if `silu`), stored straight into the next causal
    conv's padded input `next_padded` (frame t at frame ``pad[4] + cache_frames + t``, pixel (h, w) at
    ``(pad[2] + h, pad[0] + w)``) and y's last two frames also into `next_cache` ([B, O, 2, H, W]; for a
    1-frame y, slot 1): the positions `triton_norm.rms_norm_padded_channels_last` stores of an x equal to y.
    Both buffers channels-last, as `triton_pad.causal_pad_rest_channels_last` allocates them (it writes their
    other positions). Tolerance: the norm runs in fp32 from y (squares summed in the tile's order, a
    multiply by the reciprocal norm, Triton's sigmoid) and rounds once, where ATen rounds after each op."""
    shape = _checked_shapes(padded, weight, bias)
    batch, out_channels, frames, rows, columns = shape
    tile = config or launch_config(padded.shape[1], out_channels)
    reason = norm_epilogue_reason(out_channels, tile)
    if reason is not None:
        raise ValueError(f"conv3d_channels_last_norm_padded: {reason}")
    cl = torch.channels_last_3d
    wl, _, hl, _, tl_, _ = pad
    geometry = (next_padded.shape[2], next_padded.shape[3], next_padded.shape[4], tl_ + cache_frames, hl, wl,
                frames - 2)
    expected_cache = (batch, out_channels, 2, rows, columns)
    if (next_padded.shape[:2] != shape[:2] or geometry[3] + frames > geometry[0] or hl + rows > geometry[1]
            or wl + columns > geometry[2] or tuple(next_cache.shape) != expected_cache
            or not (next_padded.is_contiguous(memory_format=cl) and next_cache.is_contiguous(memory_format=cl))
            or next_padded.dtype != padded.dtype or next_cache.dtype != padded.dtype):
        raise ValueError(f"conv3d_channels_last_norm_padded: next padded input {tuple(next_padded.shape)} / next "
                         f"cache {tuple(next_cache.shape)} (channels-last, {padded.dtype}) do not hold a {shape} "
                         f"output padded by {pad} after {cache_frames} cache frames")
    if gamma.numel() != out_channels:
        raise ValueError(f"conv3d_channels_last_norm_padded: gamma must have {out_channels} values, got {gamma.numel()}")
    if batch * frames * rows * columns == 0:
        return
    _launch(padded, weight, tile, shape, bias, next_padded, (0,) * 5, None, None,
            norm=(gamma, next_cache, geometry, scale, norm_bias, eps, silu))
