"""Triton kernels of the Wan RMS norm (+ SiLU), bit-identical to ATen's ops, each beside its launcher.

- `rms_norm_fused`: the whole norm in one kernel whose channel sums follow ATen's `linalg_vector_norm`
  order (`rewrite.kernels.norm.aten_reduction`; the plan from `rewrite.kernels.layout.norm_plan`), reading x twice and
  writing the output once; `channel_norm` is its first pass alone (tests).
- `rms_norm`: the op's kernel path: `rms_norm_fused` where the order is reproduced, else ATen's reduction
  and one epilogue kernel (`_rms_norm_plane_kernel` for contiguous (h, w) planes, else
  `_rms_norm_epilogue_kernel`, any strides).
- `rms_norm_padded_channels_last`: the fused norm storing straight into a causal conv's padded
  channels-last input and its next cache (`rewrite.kernels.pad.causal_pad` writes the rest).
- `silu`: the epilogue's SiLU alone, for the exhaustive self-test (`rewrite.ops.selftest`).

Rounding rules kept: every value ATen materializes in the activation dtype is rounded to that dtype here too
(fp32 math in between, as ATen's opmath), divisions are IEEE (`div_rn`), no FMA contraction, `+ 0.0` is kept
(it turns -0 into +0), scalars are rounded to fp32 as ATen's CUDA kernels do, and exp is libdevice's `expf`
(what ATen's CUDA SiLU calls); every launch has the exact flags of `rewrite.kernels.launch.launch`. Under
`TRITON_INTERPRET=1` exp is numpy's, so SiLU is then only close.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rewrite.kernels.norm import aten_reduction
from rewrite.kernels import layout
from rewrite.ops.dispatch import triton
from rewrite.kernels.layout import as5d, norm_threads, planes_contiguous, reference_layout, run_stride
from rewrite.kernels.launch import BLOCK, launch, launch_flat, plane_grid
from rewrite.kernels.pad.causal_pad import causal_pad_rest_channels_last
from rewrite.kernels.norm.reference import rms_norm_reference

if triton is not None:
    import triton.language as tl

    from rewrite.kernels.index import plane_coords as _plane
    from rewrite.kernels.index import position as _position
    from rewrite.kernels.aten_math import exp as _exp
    from rewrite.kernels.aten_math import round_to as _round

    @triton.jit
    def _rms_norm_epilogue_kernel(x_ptr, norm_ptr, gamma_ptr, out_ptr, numel, C, T, H, W,
                                  sx0, sx1, sx2, sx3, sx4, so0, so1, so2, so3, so4,
                                  scale, bias, eps,
                                  UPCAST: tl.constexpr, SILU: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < numel
        b, c, t, h, w = _position(i, C, T, H, W)
        x = tl.load(x_ptr + b * sx0 + c * sx1 + t * sx2 + h * sx3 + w * sx4, mask=mask, other=0.0)
        dtype = x.dtype
        norm = tl.load(norm_ptr + ((b * T + t) * H + h) * W + w, mask=mask, other=1.0)
        norm = tl.where(norm < eps, eps, norm)  # clamp_min: NaN stays NaN
        y = tl.math.div_rn(x.to(tl.float32), norm)
        if UPCAST:
            y = _round(y, dtype).to(tl.float32)  # .to(x.dtype) after the fp32 normalize
        y = _round(y * scale, dtype).to(tl.float32)
        gamma = tl.load(gamma_ptr + c, mask=mask, other=0.0).to(tl.float32)
        y = _round(y * gamma, dtype).to(tl.float32)
        y = _round(y + bias, dtype).to(tl.float32)
        if SILU:
            y = tl.math.div_rn(y, 1.0 + _exp(-y))
        tl.store(out_ptr + b * so0 + c * so1 + t * so2 + h * so3 + w * so4, _round(y, dtype), mask=mask)

    @triton.jit
    def _rms_norm_plane_kernel(x_ptr, norm_ptr, gamma_ptr, out_ptr, C, T, S, sx0, sx1, sx2, so0, so1, so2,
                               scale, bias, eps, UPCAST: tl.constexpr, SILU: tl.constexpr, BLOCK: tl.constexpr):
        """`_rms_norm_epilogue_kernel` for tensors whose (h, w) planes are contiguous: one plane (b, c, t) per
        program along axis 0, BLOCK spatial positions along axis 1 (no per-element index division; gamma is
        one scalar per program). Same arithmetic, element for element."""
        b, c, t = _plane(tl.program_id(0), C, T)
        s = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = s < S
        x = tl.load(x_ptr + (b * sx0 + c * sx1 + t * sx2) + s, mask=mask, other=0.0)
        dtype = x.dtype
        norm = tl.load(norm_ptr + (b * T + t) * S + s, mask=mask, other=1.0)
        norm = tl.where(norm < eps, eps, norm)  # clamp_min: NaN stays NaN
        y = tl.math.div_rn(x.to(tl.float32), norm)
        if UPCAST:
            y = _round(y, dtype).to(tl.float32)  # .to(x.dtype) after the fp32 normalize
        y = _round(y * scale, dtype).to(tl.float32)
        gamma = tl.load(gamma_ptr + c).to(tl.float32)
        y = _round(y * gamma, dtype).to(tl.float32)
        y = _round(y + bias, dtype).to(tl.float32)
        if SILU:
            y = tl.math.div_rn(y, 1.0 + _exp(-y))
        tl.store(out_ptr + (b * so0 + c * so1 + t * so2) + s, _round(y, dtype), mask=mask)

    @triton.jit
    def _fold_halves(s, G: tl.constexpr, N: tl.constexpr, P: tl.constexpr):
        """[G, N, P] -> [G, N // 2, P]: in each of G blocks, row y plus row y + N // 2 (one step of ATen's
        `block_y_reduce` tree)."""
        lo, hi = tl.split(tl.permute(tl.reshape(s, [G, 2, N // 2, P]), [0, 2, 3, 1]))
        return lo + hi

    @triton.jit
    def _thread_sums(acc, THREADS: tl.constexpr, BLOCK_P: tl.constexpr):
        """[4 THREADS, P] accumulators (row i * THREADS + thread) -> [THREADS, P]: ((a0 + a1) + a2) + a3."""
        even, odd = tl.split(tl.permute(tl.reshape(acc, [2, 2, THREADS, BLOCK_P]), [2, 3, 0, 1]))
        acc0, acc2 = tl.split(even)
        acc1, acc3 = tl.split(odd)
        return ((acc0 + acc1) + acc2) + acc3

    @triton.jit
    def _block_tree(s, G: tl.constexpr, SPLIT: tl.constexpr, BLOCK_P: tl.constexpr):
        """[G, SPLIT, P] -> [G, P]: ATen's `block_y_reduce` halving tree over the SPLIT threads of each block."""
        if SPLIT >= 16:
            s = _fold_halves(s, G, 16, BLOCK_P)
        if SPLIT >= 8:
            s = _fold_halves(s, G, 8, BLOCK_P)
        if SPLIT >= 4:
            s = _fold_halves(s, G, 4, BLOCK_P)
        if SPLIT >= 2:
            s = _fold_halves(s, G, 2, BLOCK_P)
        return tl.reshape(s, [G, BLOCK_P])

    @triton.jit
    def _with_deferred_bias(x, xb_ptr, c, C, m, HAS_XBIAS: tl.constexpr):
        """A [channels, pixels] tile of x, plus x's deferred conv bias with ATen's `add_` rounding (HAS_XBIAS:
        x is a conv output whose bias was not added); masked positions 0."""
        if HAS_XBIAS:
            b = tl.load(xb_ptr + c, mask=c < C, other=0.0).to(tl.float32)[:, None]
            x = tl.where(m, _round(x.to(tl.float32) + b, x.dtype), 0.0).to(x.dtype)
        return x

    @triton.jit
    def _channel_sum(x_ptr, x_pix, pmask, LO, C, sx1, SPLIT: tl.constexpr, CTAS: tl.constexpr,
                     CTAS_P2: tl.constexpr, BLOCK_P: tl.constexpr, UNROLL: tl.constexpr = 1, xb_ptr=None,
                     HAS_XBIAS: tl.constexpr = False):
        """fp32 sum of squares over channels LO .. C - 1 of BLOCK_P pixels, in ATen's order (`aten_reduction`),
        channel LO counting as the first. One block (CTAS == 1): accumulator row i * SPLIT + y holds thread y's
        accumulator i, over channels 4 SPLIT k + i SPLIT + y. CTAS blocks (padded to CTAS_P2 rows of threads):
        row (i * CTAS_P2 + g) * SPLIT + y holds accumulator i of thread y of block g, over channels
        (4 k + i) SPLIT CTAS + g SPLIT + y; the block partials are then added as `global_reduce` adds them."""
        if CTAS == 1:
            GROUP: tl.constexpr = 4 * SPLIT
            rows = tl.arange(0, GROUP)
            acc = tl.zeros([GROUP, BLOCK_P], dtype=tl.float32)
            for c0 in range(LO, C, GROUP * UNROLL):  # UNROLL loads in flight; the same adds in the same order
                for u in tl.static_range(UNROLL):
                    c = c0 + u * GROUP + rows
                    m = (c < C)[:, None] & pmask[None, :]
                    v = tl.load(x_ptr + x_pix[None, :] + c[:, None].to(tl.int64) * sx1, mask=m, other=0.0)
                    v = _with_deferred_bias(v, xb_ptr, c, C, m, HAS_XBIAS).to(tl.float32)
                    acc = tl.fma(v, v, acc)  # masked channels add +0.0 to a non-negative sum: no change
            sums = tl.reshape(_thread_sums(acc, SPLIT, BLOCK_P), [1, SPLIT, BLOCK_P])
            total = tl.reshape(_block_tree(sums, 1, SPLIT, BLOCK_P), [BLOCK_P])
        else:
            THREADS: tl.constexpr = CTAS_P2 * SPLIT
            rows = tl.arange(0, 4 * THREADS)
            block = (rows // SPLIT) % CTAS_P2
            first = (rows // THREADS) * (SPLIT * CTAS) + block * SPLIT + rows % SPLIT
            acc = tl.zeros([4 * THREADS, BLOCK_P], dtype=tl.float32)
            for c0 in range(LO, C, 4 * SPLIT * CTAS * UNROLL):
                for u in tl.static_range(UNROLL):
                    c = c0 + u * (4 * SPLIT * CTAS) + first
                    m = ((block < CTAS) & (c < C))[:, None] & pmask[None, :]
                    v = tl.load(x_ptr + x_pix[None, :] + c[:, None].to(tl.int64) * sx1, mask=m, other=0.0)
                    v = _with_deferred_bias(v, xb_ptr, c, C, m, HAS_XBIAS).to(tl.float32)
                    acc = tl.fma(v, v, acc)
            sums = tl.reshape(_thread_sums(acc, THREADS, BLOCK_P), [CTAS_P2, SPLIT, BLOCK_P])
            partial = _block_tree(sums, CTAS_P2, SPLIT, BLOCK_P)  # P_g: block g's tree result
            block_rows = tl.arange(0, CTAS_P2)[:, None]
            thread_rows = tl.arange(0, SPLIT)[:, None]
            last = tl.zeros([SPLIT, BLOCK_P], dtype=tl.float32)
            for g in tl.static_range(CTAS):  # thread g % SPLIT adds P_g, in g order, from 0
                p_g = tl.sum(tl.where(block_rows == g, partial, 0.0), axis=0)  # one non-zero term: exact
                last = last + tl.where(thread_rows == g % SPLIT, p_g[None, :], 0.0)  # + 0.0 elsewhere: no change
            total = tl.reshape(_block_tree(tl.reshape(last, [1, SPLIT, BLOCK_P]), 1, SPLIT, BLOCK_P), [BLOCK_P])
        return total

    @triton.jit
    def _channel_norm(x_ptr, x_pix, pmask, E1, E2, E3, E4, sx1, SPLIT: tl.constexpr, CTAS: tl.constexpr,
                      CTAS_P2: tl.constexpr, BLOCK_P: tl.constexpr, UNROLL: tl.constexpr = 1, xb_ptr=None,
                      HAS_XBIAS: tl.constexpr = False, PIECES: tl.constexpr = 1):
        """fp32 L2 norm over the channels of BLOCK_P pixels in ATen's order: the sums of the PIECES channel
        ranges [0, E1), [E1, E2), ... (ATen's 32-bit pieces, `NormPlan.pieces`; one range [0, E1) where the
        input fits) added left to right, then the IEEE square root."""
        total = _channel_sum(x_ptr, x_pix, pmask, 0, E1, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P, UNROLL, xb_ptr, HAS_XBIAS)
        if PIECES > 1:
            total += _channel_sum(x_ptr, x_pix, pmask, E1, E2, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P, UNROLL, xb_ptr,
                                  HAS_XBIAS)
        if PIECES > 2:
            total += _channel_sum(x_ptr, x_pix, pmask, E2, E3, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P, UNROLL, xb_ptr,
                                  HAS_XBIAS)
        if PIECES > 3:
            total += _channel_sum(x_ptr, x_pix, pmask, E3, E4, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P, UNROLL, xb_ptr,
                                  HAS_XBIAS)
        return tl.sqrt_rn(total)

    @triton.jit
    def _norm_epilogue(x, norm, gamma_ptr, c, C, scale, bias, UPCAST: tl.constexpr, SILU: tl.constexpr):
        """`_rms_norm_epilogue_kernel`'s arithmetic on a [channels, pixels] tile (norm already clamped)."""
        dtype = x.dtype
        y = tl.math.div_rn(x.to(tl.float32), norm)
        if UPCAST:
            y = _round(y, dtype).to(tl.float32)  # .to(x.dtype) after the fp32 normalize
        y = _round(y * scale, dtype).to(tl.float32)
        gamma = tl.load(gamma_ptr + c, mask=c < C, other=0.0).to(tl.float32)[:, None]
        y = _round(y * gamma, dtype).to(tl.float32)
        y = _round(y + bias, dtype).to(tl.float32)
        if SILU:
            y = tl.math.div_rn(y, 1.0 + _exp(-y))
        return _round(y, dtype)

    @triton.jit
    def _plane_pixels(T, HW, BLOCK_P: tl.constexpr):
        """(b, t, positions, mask) of the BLOCK_P (h, w) positions of program (plane = b * T + t, block)."""
        plane = tl.program_id(0)
        hw = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)
        return (plane // T).to(tl.int64), (plane % T).to(tl.int64), hw, hw < HW

    @triton.jit
    def _normalized_channels(x_ptr, x_pix, pmask, c, C, sx1, norm, gamma_ptr, scale, bias, UPCAST: tl.constexpr,
                             SILU: tl.constexpr, xb_ptr=None, HAS_XBIAS: tl.constexpr = False):
        """(output values, mask) of channels c of the pixels: the second read of x and `_norm_epilogue`."""
        m = (c < C)[:, None] & pmask[None, :]
        x = tl.load(x_ptr + x_pix[None, :] + c[:, None].to(tl.int64) * sx1, mask=m, other=0.0)
        x = _with_deferred_bias(x, xb_ptr, c, C, m, HAS_XBIAS)
        return _norm_epilogue(x, norm, gamma_ptr, c, C, scale, bias, UPCAST, SILU), m

    @triton.jit
    def _rms_norm_fused_kernel(x_ptr, gamma_ptr, out_ptr, C, E1, E2, E3, E4, T, HW, sx0, sx1, sx2, so0, so1, so2,
                               scale, bias, eps, UPCAST: tl.constexpr, SILU: tl.constexpr, SPLIT: tl.constexpr,
                               CTAS: tl.constexpr, CTAS_P2: tl.constexpr, BLOCK_P: tl.constexpr,
                               GROUP: tl.constexpr, UNROLL: tl.constexpr, PIECES: tl.constexpr):
        """The whole Wan RMS norm for BLOCK_P pixels of one (b, t) plane (contiguous (h, w) planes, plane
        number along axis 0 as in `_rms_norm_plane_kernel`): the channel norm in ATen's order, then the
        epilogue of `_rms_norm_epilogue_kernel` (same arithmetic, element for element) over a second read,
        GROUP channels at a time."""
        b, t, hw, pmask = _plane_pixels(T, HW, BLOCK_P)
        x_pix = b * sx0 + t * sx2 + hw
        o_pix = b * so0 + t * so2 + hw
        norm = _channel_norm(x_ptr, x_pix, pmask, E1, E2, E3, E4, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P, UNROLL,
                             PIECES=PIECES)
        norm = tl.where(norm < eps, eps, norm)[None, :]  # clamp_min: NaN stays NaN
        for c0 in range(0, C, GROUP):
            c = c0 + tl.arange(0, GROUP)
            y, m = _normalized_channels(x_ptr, x_pix, pmask, c, C, sx1, norm, gamma_ptr, scale, bias, UPCAST, SILU)
            tl.store(out_ptr + o_pix[None, :] + c[:, None].to(tl.int64) * so1, y, mask=m)

    @triton.jit
    def _rms_norm_padded_kernel(x_ptr, xb_ptr, gamma_ptr, out_ptr, next_ptr, C, E1, E2, E3, E4, T, HW, W,
                                sx0, sx1, sx2, sxp, TO, HO, WO, FT, PH, PW, SLOT0, scale, bias, eps,
                                UPCAST: tl.constexpr, SILU: tl.constexpr, SPLIT: tl.constexpr,
                                CTAS: tl.constexpr, CTAS_P2: tl.constexpr, BLOCK_P: tl.constexpr,
                                GROUP: tl.constexpr, UNROLL: tl.constexpr, HAS_XBIAS: tl.constexpr,
                                PIECES: tl.constexpr):
        """`_rms_norm_fused_kernel` storing its output straight into a causal conv's padded input, channels-last
        ([B, TO, HO, WO, C] in memory; frame t of x at padded frame FT + t, pixel (h, w) at (PH + h, PW + w)),
        and frames SLOT0 and SLOT0 + 1 of x also into the next cache ([B, 2, H, W, C] in memory). x's (h, w)
        positions are one run of stride sxp (1: contiguous planes; C: channels-last); with HAS_XBIAS the norm's
        input is x plus the deferred conv bias at xb_ptr (`_with_deferred_bias`)."""
        b, t, hw, pmask = _plane_pixels(T, HW, BLOCK_P)
        x_pix = b * sx0 + t * sx2 + hw * sxp
        h = (hw // W).to(tl.int64)
        w = (hw % W).to(tl.int64)
        o_pix = (((b * TO + FT + t) * HO + PH + h) * WO + PW + w) * C
        slot = t - SLOT0
        n_pix = (((b * 2 + slot) * (HW // W) + h) * W + w) * C
        norm = _channel_norm(x_ptr, x_pix, pmask, E1, E2, E3, E4, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P, UNROLL, xb_ptr,
                             HAS_XBIAS, PIECES)
        norm = tl.where(norm < eps, eps, norm)[None, :]  # clamp_min: NaN stays NaN
        for c0 in range(0, C, GROUP):
            c = c0 + tl.arange(0, GROUP)
            y, m = _normalized_channels(x_ptr, x_pix, pmask, c, C, sx1, norm, gamma_ptr, scale, bias, UPCAST, SILU,
                                        xb_ptr, HAS_XBIAS)
            tl.store(out_ptr + o_pix[None, :] + c[:, None], y, mask=m)
            if (slot >= 0) & (slot < 2):
                tl.store(next_ptr + n_pix[None, :] + c[:, None], y, mask=m)

    @triton.jit
    def _channel_norm_kernel(x_ptr, norm_ptr, E1, E2, E3, E4, T, HW, sx0, sx1, sx2, SPLIT: tl.constexpr,
                             CTAS: tl.constexpr, CTAS_P2: tl.constexpr, BLOCK_P: tl.constexpr, UNROLL: tl.constexpr,
                             PIECES: tl.constexpr):
        """The channel norm alone (contiguous [B, T, H, W] fp32 output), for tests against ATen's."""
        b, t, hw, pmask = _plane_pixels(T, HW, BLOCK_P)
        norm = _channel_norm(x_ptr, b * sx0 + t * sx2 + hw, pmask, E1, E2, E3, E4, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P,
                             UNROLL, PIECES=PIECES)
        tl.store(norm_ptr + (b * T + t) * HW + hw, norm, mask=pmask)

    @triton.jit
    def _silu_kernel(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < numel
        x = tl.load(x_ptr + i, mask=mask, other=0.0)
        y = x.to(tl.float32)
        tl.store(out_ptr + i, _round(tl.math.div_rn(y, 1.0 + _exp(-y)), x.dtype), mask=mask)


# Tiling of the fused norm (H200 sweeps: docs/tuning.md section 5, "Fused RMS norm")
NORM_TILE = 1024  # accumulator values per program of the fused norm (8 fp32 registers a thread at 4 warps)
NORM_WARPS = 4
NORM_UNROLL = 2  # channel groups loaded per step of the first pass
#: ... where one thread sums each output (split 1: groups of 4 channels, 8 bytes a pixel in bf16): 16 channels
#: in flight, one 32-byte sector of a channels-last pixel
NORM_UNROLL_SPLIT1 = 4
NORM_WARPS_WIDE = 8  # 256 channels and more over large planes
NORM_STORE_CHANNELS = 64  # channels per step of the second pass where the channel count is a multiple
#: ... and at least this many where they divide the channel count (one 32-byte sector of a bf16 pixel)
NORM_STORE_MIN_CHANNELS = 16


def _pixels_block(threads: int, pixels: int, ctas: int = 1) -> int:
    """Pixels per program of the fused norm: a [4 threads, pixels] fp32 accumulator of NORM_TILE values (at
    least 32 pixels); where a plane is too small to fill the GPU with large blocks, 32 (16 or 64 for a
    cross-block order, whose rows are many)."""
    if pixels < 16 * 1024:
        return 32 if ctas == 1 else 16 if pixels < 8 * 1024 else 64
    return max(32, min(512, NORM_TILE // (4 * threads)))


def _store_channels(channels: int, split: int) -> int:
    """Channels per step of the second pass (normalize and store; any grouping gives the same values):
    NORM_STORE_CHANNELS where the channel count is a multiple, else the first pass's 4 `split`, but at least
    NORM_STORE_MIN_CHANNELS where that divides the count: a channels-last output stored 4 channels a pixel at a
    time (8 bytes of every 32-byte sector, as split 1 gave at 1088x1920) ran several times slower."""
    if channels % NORM_STORE_CHANNELS == 0:
        return max(4 * split, NORM_STORE_CHANNELS)
    if 4 * split < NORM_STORE_MIN_CHANNELS and channels % NORM_STORE_MIN_CHANNELS == 0:
        return NORM_STORE_MIN_CHANNELS
    return 4 * split


def _norm_constexprs(split: int, ctas: int, channels: int, pixels: int, pieces: tuple[int, ...] = ()) -> dict:
    """The fused norm kernels' compile-time tiling for one input."""
    threads = norm_threads(split, ctas)
    block_p = _pixels_block(threads, pixels, ctas)
    return dict(SPLIT=split, CTAS=ctas, CTAS_P2=triton.next_power_of_2(ctas), BLOCK_P=block_p,
                GROUP=_store_channels(channels, split),
                UNROLL=NORM_UNROLL_SPLIT1 if split == 1 and ctas == 1 else NORM_UNROLL, PIECES=len(pieces) + 1)


def _piece_ends(pieces: tuple[int, ...], channels: int) -> tuple[int, int, int, int]:
    """The kernels' E1..E4: where each of the channel pieces (`aten_reduction.NormPlan.pieces`) ends, the unused
    ones at `channels`."""
    if len(pieces) >= aten_reduction.MAX_PIECES or list(pieces) != sorted(set(pieces)) or not all(
            0 < p < channels for p in pieces):
        raise ValueError(f"norm pieces: expected at most {aten_reduction.MAX_PIECES - 1} increasing channel "
                         f"boundaries inside 1..{channels - 1}, got {pieces!r}")
    ends = (*pieces, channels)
    return ends + (channels,) * (aten_reduction.MAX_PIECES - len(ends))


def _norm_warps(channels: int, pixels: int) -> int:
    return NORM_WARPS_WIDE if channels >= 256 and pixels >= 16 * 1024 else NORM_WARPS


def channel_norm(x: Tensor, split: int, ctas: int = 1, pieces: tuple[int, ...] = ()) -> Tensor:
    """fp32 L2 norm over dim 1 in ATen's order for `split` threads in `ctas` blocks (see `aten_reduction`),
    over the channel `pieces` of a 32-bit split, shape [B, 1, T, H, W]. x's (h, w) planes must be contiguous."""
    x5 = as5d(x)
    b, c, t, h, w = x5.shape
    norm = torch.empty((b, 1, t, h, w), dtype=torch.float32, device=x.device)
    constexprs = _norm_constexprs(split, ctas, c, h * w, pieces)
    if norm.numel():
        constexprs.pop("GROUP")
        launch(_channel_norm_kernel, (b * t, triton.cdiv(h * w, constexprs["BLOCK_P"])),
               x5, norm, *_piece_ends(pieces, c), t, h * w, *x5.stride()[:3], **constexprs)
    return norm.view([b, 1, *x.shape[2:]])


def rms_norm_fused(x: Tensor, gamma: Tensor, scale: float, bias: float, eps: float, upcast: bool, silu: bool,
                   split: int, ctas: int = 1, pieces: tuple[int, ...] = ()) -> Tensor:
    """The whole Wan RMS norm (+ SiLU when `silu`) in one kernel whose channel sums follow ATen's order for
    `split` threads in `ctas` blocks over the channel `pieces` of a 32-bit split (`aten_reduction.plan`):
    reads x twice (the second time mostly from L2), writes the output once.
    x's (h, w) planes must be contiguous (contiguous and frame-major layouts)."""
    strides = reference_layout(("rms_norm", upcast, None),
                               lambda a, g: rms_norm_reference(a, g, 1.0, 0.0, 1e-12, upcast, None), x, gamma)
    out = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)
    x5, o5 = as5d(x), as5d(out)
    b, c, t, h, w = x5.shape
    if not planes_contiguous(x5, o5):
        raise ValueError("rms_norm_fused: x and the output need contiguous (h, w) planes")
    constexprs = _norm_constexprs(split, ctas, c, h * w, pieces)
    if out.numel():
        launch(_rms_norm_fused_kernel, (b * t, triton.cdiv(h * w, constexprs["BLOCK_P"])),
               x5, gamma, o5, c, *_piece_ends(pieces, c), t, h * w, *x5.stride()[:3], *o5.stride()[:3],
               float(scale), float(bias), float(eps),
               UPCAST=upcast, SILU=silu, **constexprs, num_warps=_norm_warps(c, h * w))
    return out


def rms_norm(x: Tensor, gamma: Tensor, scale: float, bias: float, eps: float, upcast: bool,
             act: str | None, fused_silu: bool = True, rows: int | None = None) -> Tensor:
    """The Wan RMS norm: `rms_norm_fused` where `aten_reduction` knows ATen's order for x (for the tensor of
    `rows` rows that x is a band of, if given); else ATen's reduction, then one epilogue kernel. SiLU is
    folded in when `fused_silu`, else applied by ATen after."""
    silu_here = act == "silu" and fused_silu
    plan = layout.norm_plan(x, upcast, rows=rows)
    if plan is not None:
        out = rms_norm_fused(x, gamma, scale, bias, eps, upcast, silu_here, plan.split, plan.ctas, plan.pieces)
        return torch.nn.functional.silu(out) if act == "silu" and not fused_silu else out
    strides = reference_layout(("rms_norm", upcast, act),
                               lambda a, g: rms_norm_reference(a, g, 1.0, 0.0, 1e-12, upcast, act), x, gamma)
    xf = x.float() if upcast else x
    norm = torch.linalg.vector_norm(xf, 2, [1], True).contiguous()
    out = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)
    x5, o5, n5 = as5d(x), as5d(out), as5d(norm)
    b, c, t, h, w = x5.shape
    if out.numel() and planes_contiguous(x5, o5):
        launch(_rms_norm_plane_kernel, plane_grid(b, c, t, h * w),
               x5, n5, gamma, o5, c, t, h * w, *x5.stride()[:3], *o5.stride()[:3], float(scale), float(bias),
               float(eps), UPCAST=upcast, SILU=silu_here, BLOCK=BLOCK)
    else:
        launch_flat(_rms_norm_epilogue_kernel, out.numel(), x5, n5, gamma, o5, out.numel(), c, t, h, w,
                    *x5.stride(), *o5.stride(), float(scale), float(bias), float(eps), UPCAST=upcast, SILU=silu_here)
    if act == "silu" and not fused_silu:
        out = torch.nn.functional.silu(out)
    return out


def silu(x: Tensor) -> Tensor:
    """SiLU of a contiguous tensor with the norm kernel's formula (for the exhaustive self-test)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    launch_flat(_silu_kernel, x.numel(), x, out, x.numel())
    return out


def rms_norm_padded_channels_last(x: Tensor, gamma: Tensor, scale: float, bias: float, eps: float, upcast: bool,
                                  silu: bool, split: int, cache: Tensor | None, pad: list[int],
                                  ctas: int = 1, x_bias: Tensor | None = None,
                                  next_cache: Tensor | None = None,
                                  pieces: tuple[int, ...] = ()) -> tuple[Tensor, Tensor]:
    """`causal_pad_channels_last(rms_norm(x [+ x_bias]), cache, pad)` without materializing the norm: the norm
    kernel stores into the padded buffer and the next cache, the pad kernel writes only the rest (cache frames,
    zero pad). x's (h, w) positions must be one strided run (contiguous planes, or channels-last); `split`,
    `ctas`, `pieces` are `aten_reduction`'s plan for the layout whose summation order the norm must follow. `x_bias`: x
    is a conv output whose bias was deferred; the norm's input is `x.add_(x_bias)` (ATen's rounding).
    `next_cache`: the buffer the next cache is written into (`triton_pad.causal_pad_rest_channels_last`)."""
    pixel_stride = run_stride(x)
    if pixel_stride is None:
        raise ValueError(f"rms_norm_padded_channels_last: x's (h, w) positions are not one strided run {x.stride()}")
    out, next_cache = causal_pad_rest_channels_last(x, cache, pad, next_cache)
    if not out.numel():
        return out, next_cache
    wl, _, hl, _, tl_, _ = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    _, _, frames_out, rows_out, columns_out = out.shape
    constexprs = _norm_constexprs(split, ctas, c, h * w, pieces)
    launch(_rms_norm_padded_kernel, (b * tx, triton.cdiv(h * w, constexprs["BLOCK_P"])),
           x, x if x_bias is None else x_bias, gamma, out, next_cache, c, *_piece_ends(pieces, c), tx, h * w, w,
           *x.stride()[:3], pixel_stride,
           frames_out, rows_out, columns_out, tl_ + tc, hl, wl, tx - 2, float(scale), float(bias), float(eps),
           UPCAST=upcast, SILU=silu, HAS_XBIAS=x_bias is not None, **constexprs, num_warps=_norm_warps(c, h * w))
    return out, next_cache
