"""Triton kernels behind the Wan custom ops, bit-identical to the ATen subgraphs they replace.

Rounding rules kept (DESIGN section 4): every value ATen materializes in the activation dtype is rounded
to that dtype here too (fp32 math in between, as ATen's opmath), divisions are IEEE (`div_rn`), no FMA
contraction (`enable_fp_fusion=False` on every launch), `+ 0.0` is kept (it turns -0 into +0), scalars are
rounded to fp32 as ATen's CUDA kernels do, and exp is libdevice's `expf` (what ATen's CUDA SiLU calls).
The RMS-norm denominator is summed in the order of ATen's own `linalg_vector_norm` kernel
(`rewrite.ops.aten_reduction`) or left to that kernel where the order is not reproduced.

All kernels index 5-D tensors by logical position and per-tensor strides, so they accept the layouts the
captured graphs produce (contiguous and frame-major permuted views); outputs get the layout ATen would
give them (`reference_layout`). Under `TRITON_INTERPRET=1` the kernels run on CPU tensors (tests); there
exp is numpy's, so math kernels are then only close, not equal, to ATen's CPU kernels.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rewrite.ops import aten_reduction
from rewrite.ops.dispatch import triton

BLOCK = 1024
PAD_TILE = 4096  # elements per program of the causal pad kernel (rows x columns, both powers of two)

if triton is not None:
    import triton.language as tl

    from rewrite.ops.triton_math import exp as _exp
    from rewrite.ops.triton_math import round_to as _round

    @triton.jit
    def _position(i, C, T, H, W):
        """Logical (b, c, t, h, w) of flat index i in a [B, C, T, H, W] row-major enumeration."""
        w = i % W
        r = i // W
        h = r % H
        r = r // H
        t = r % T
        r = r // T
        return r // C, r % C, t, h, w

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
    def _plane(plane, C, T):
        """(b, c, t) of (h, w) plane number `plane` of a [B, C, T, H, W] tensor, as int64."""
        r = plane // T
        return (r // C).to(tl.int64), (r % C).to(tl.int64), (plane % T).to(tl.int64)

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
    def _channel_norm(x_ptr, x_pix, pmask, C, sx1, SPLIT: tl.constexpr, CTAS: tl.constexpr, CTAS_P2: tl.constexpr,
                      BLOCK_P: tl.constexpr, UNROLL: tl.constexpr = 1, xb_ptr=None, HAS_XBIAS: tl.constexpr = False):
        """fp32 L2 norm over the C channels of BLOCK_P pixels, summed in ATen's order (`aten_reduction`).
        One block (CTAS == 1): accumulator row i * SPLIT + y holds thread y's accumulator i, over channels
        4 SPLIT k + i SPLIT + y. CTAS blocks (padded to CTAS_P2 rows of threads): row (i * CTAS_P2 + g) * SPLIT
        + y holds accumulator i of thread y of block g, over channels (4 k + i) SPLIT CTAS + g SPLIT + y; the
        block partials are then added as `global_reduce` adds them."""
        if CTAS == 1:
            GROUP: tl.constexpr = 4 * SPLIT
            rows = tl.arange(0, GROUP)
            acc = tl.zeros([GROUP, BLOCK_P], dtype=tl.float32)
            for c0 in range(0, C, GROUP * UNROLL):  # UNROLL loads in flight; the same adds in the same order
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
            for c0 in range(0, C, 4 * SPLIT * CTAS * UNROLL):
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
    def _rms_norm_fused_kernel(x_ptr, gamma_ptr, out_ptr, C, T, HW, sx0, sx1, sx2, so0, so1, so2, scale, bias, eps,
                               UPCAST: tl.constexpr, SILU: tl.constexpr, SPLIT: tl.constexpr,
                               CTAS: tl.constexpr, CTAS_P2: tl.constexpr, BLOCK_P: tl.constexpr,
                               GROUP: tl.constexpr, UNROLL: tl.constexpr):
        """The whole Wan RMS norm for BLOCK_P pixels of one (b, t) plane (contiguous (h, w) planes, plane
        number along axis 0 as in `_rms_norm_plane_kernel`): the channel norm in ATen's order, then the
        epilogue of `_rms_norm_epilogue_kernel` (same arithmetic, element for element) over a second read,
        GROUP channels at a time."""
        b, t, hw, pmask = _plane_pixels(T, HW, BLOCK_P)
        x_pix = b * sx0 + t * sx2 + hw
        o_pix = b * so0 + t * so2 + hw
        norm = _channel_norm(x_ptr, x_pix, pmask, C, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P, UNROLL)
        norm = tl.where(norm < eps, eps, norm)[None, :]  # clamp_min: NaN stays NaN
        for c0 in range(0, C, GROUP):
            c = c0 + tl.arange(0, GROUP)
            y, m = _normalized_channels(x_ptr, x_pix, pmask, c, C, sx1, norm, gamma_ptr, scale, bias, UPCAST, SILU)
            tl.store(out_ptr + o_pix[None, :] + c[:, None].to(tl.int64) * so1, y, mask=m)

    @triton.jit
    def _rms_norm_padded_kernel(x_ptr, xb_ptr, gamma_ptr, out_ptr, next_ptr, C, T, HW, W, sx0, sx1, sx2, sxp,
                                TO, HO, WO, FT, PH, PW, SLOT0, scale, bias, eps,
                                UPCAST: tl.constexpr, SILU: tl.constexpr, SPLIT: tl.constexpr,
                                CTAS: tl.constexpr, CTAS_P2: tl.constexpr, BLOCK_P: tl.constexpr,
                                GROUP: tl.constexpr, UNROLL: tl.constexpr, HAS_XBIAS: tl.constexpr):
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
        norm = _channel_norm(x_ptr, x_pix, pmask, C, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P, UNROLL, xb_ptr, HAS_XBIAS)
        norm = tl.where(norm < eps, eps, norm)[None, :]  # clamp_min: NaN stays NaN
        for c0 in range(0, C, GROUP):
            c = c0 + tl.arange(0, GROUP)
            y, m = _normalized_channels(x_ptr, x_pix, pmask, c, C, sx1, norm, gamma_ptr, scale, bias, UPCAST, SILU,
                                        xb_ptr, HAS_XBIAS)
            tl.store(out_ptr + o_pix[None, :] + c[:, None], y, mask=m)
            if (slot >= 0) & (slot < 2):
                tl.store(next_ptr + n_pix[None, :] + c[:, None], y, mask=m)

    @triton.jit
    def _channel_norm_kernel(x_ptr, norm_ptr, C, T, HW, sx0, sx1, sx2, SPLIT: tl.constexpr, CTAS: tl.constexpr,
                             CTAS_P2: tl.constexpr, BLOCK_P: tl.constexpr, UNROLL: tl.constexpr):
        """The channel norm alone (contiguous [B, T, H, W] fp32 output), for tests against ATen's."""
        b, t, hw, pmask = _plane_pixels(T, HW, BLOCK_P)
        norm = _channel_norm(x_ptr, b * sx0 + t * sx2 + hw, pmask, C, sx1, SPLIT, CTAS, CTAS_P2, BLOCK_P, UNROLL)
        tl.store(norm_ptr + (b * T + t) * HW + hw, norm, mask=pmask)

    @triton.jit
    def _silu_kernel(x_ptr, out_ptr, numel, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < numel
        x = tl.load(x_ptr + i, mask=mask, other=0.0)
        y = x.to(tl.float32)
        tl.store(out_ptr + i, _round(tl.math.div_rn(y, 1.0 + _exp(-y)), x.dtype), mask=mask)

    @triton.jit
    def _causal_pad_kernel(x_ptr, cache_ptr, out_ptr, C, TO, HO, WO, TC, TX, H, W, PT, PH, PW, h_blocks,
                           sx0, sx1, sx2, sx3, sx4, sc0, sc1, sc2, sc3, sc4,
                           HAS_CACHE: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
        """A tile of ROWS output rows x BLOCK_W columns of one output plane (b, c, t) per program.

        The plane's source is one frame of x, of the cache, or zeros (decided once per program); rows
        and columns outside the source are the zero pad. Loads and stores run along contiguous rows.
        """
        pid = tl.program_id(0)
        hb = pid % h_blocks
        plane = pid // h_blocks
        b, c, t = _plane(plane, C, TO)
        h = hb * ROWS + tl.arange(0, ROWS)
        w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
        out_mask = (h < HO)[:, None] & (w < WO)[None, :]
        hs = h - PH
        ws = w - PW
        ts = t - PT
        inside = out_mask & ((hs >= 0) & (hs < H))[:, None] & ((ws >= 0) & (ws < W))[None, :]
        value = tl.zeros([ROWS, BLOCK_W], dtype=out_ptr.dtype.element_ty)  # the zero pad
        if (ts >= 0) & (ts < TC + TX):
            if ts >= TC:
                base = b * sx0 + c * sx1 + (ts - TC) * sx2
                value = tl.load(x_ptr + base + hs[:, None].to(tl.int64) * sx3 + ws[None, :] * sx4, mask=inside, other=0.0)
            elif HAS_CACHE:
                base = b * sc0 + c * sc1 + ts * sc2
                value = tl.load(cache_ptr + base + hs[:, None].to(tl.int64) * sc3 + ws[None, :] * sc4, mask=inside, other=0.0)
        offsets = plane.to(tl.int64) * HO * WO + h[:, None].to(tl.int64) * WO + w[None, :]
        tl.store(out_ptr + offsets, value, mask=out_mask)

    @triton.jit
    def _causal_pad_cl_kernel(x_ptr, cache_ptr, out_ptr, next_ptr, C, TO, HO, WO, TC, H, W, PT, PH, PW, TS,
                              sx0, sx1, sx2, sx3, sx4, sc0, sc1, sc2, sc3, sc4,
                              HAS_CACHE: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
        """`_causal_pad_kernel` writing the padded input channels-last: out is [B, TO, HO, WO, C] in memory.

        One output row (b, t, h) per program along axis 0, a BLOCK_W x BLOCK_C tile of it: read along w from
        the source frame's strided layout, stored along c (Triton moves the tile between the two layouts).
        TS = TC + (frames of x): the source frames; rows, columns and frames outside them are the zero pad.
        The rows of the last two temporal frames before the right pad (source frames, or the left pad's
        zeros when the source has fewer) are also stored, without the spatial pad, to the next cache
        ([B, 2, H, W, C] in memory): in every mode that is the next chunk's cache.
        """
        row = tl.program_id(0)
        h = row % HO
        r = row // HO
        t = r % TO
        b = (r // TO).to(tl.int64)
        w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        out_mask = (w < WO)[:, None] & (c < C)[None, :]
        hs = h - PH
        ws = w - PW
        ts = t - PT
        inside = out_mask & ((ws >= 0) & (ws < W))[:, None]
        value = tl.zeros([BLOCK_W, BLOCK_C], dtype=out_ptr.dtype.element_ty)  # the zero pad
        if (hs >= 0) & (hs < H) & (ts >= 0) & (ts < TS):
            if ts >= TC:
                base = b * sx0 + (ts - TC) * sx2 + hs * sx3
                value = tl.load(x_ptr + base + c[None, :].to(tl.int64) * sx1 + ws[:, None] * sx4, mask=inside,
                                other=0.0)
            elif HAS_CACHE:
                base = b * sc0 + ts * sc2 + hs * sc3
                value = tl.load(cache_ptr + base + c[None, :].to(tl.int64) * sc1 + ws[:, None] * sc4, mask=inside,
                                other=0.0)
        offsets = (row.to(tl.int64) * WO + w[:, None]) * C + c[None, :]
        tl.store(out_ptr + offsets, value, mask=out_mask)
        slot = ts - (TS - 2)  # 0 or 1 in the next cache's two frames
        if (slot >= 0) & (slot < 2) & (hs >= 0) & (hs < H):
            cache_rows = ((b * 2 + slot) * H + hs) * W
            tl.store(next_ptr + (cache_rows + ws[:, None]) * C + c[None, :], value, mask=inside)

    @triton.jit
    def _causal_pad_rest_cl_kernel(cache_ptr, out_ptr, next_ptr, TO, HO, H, TC, PT, PH, TS, ROW, LO, HI,
                                   sc0, sc2, sc3, HAS_CACHE: tl.constexpr, BLOCK: tl.constexpr):
        """What `_rms_norm_padded_kernel` leaves of a causal conv's channels-last padded input: the cache
        frames, the zero pad and the next-cache copies of the rows before x's frames.

        One output row (b, t, h) per program along axis 0 (ROW = WO * C values, contiguous), BLOCK of them
        along axis 1: x's pixels are [LO, HI) of a row (LO = PW * C). A cache row (frame t - PT < TC) is one
        contiguous run of the channels-last cache (W * C values from b * sc0 + frame * sc2 + row * sc3), so
        it is copied as flat blocks; rows outside the source and the pad columns are zeros. Rows of x's
        frames only get their pad columns here (programs entirely inside x return at once). Rows of the
        last two frames before the right pad that come before x's frames (cache frames, or the left pad's
        zeros when the source has fewer than two frames) also go to the next cache ([B, 2, H, W, C] memory).
        """
        row = tl.program_id(0)
        h = row % HO
        r = row // HO
        t = r % TO
        b = (r // TO).to(tl.int64)
        start = tl.program_id(1) * BLOCK
        j = start + tl.arange(0, BLOCK)
        in_row = j < ROW
        hs = h - PH
        ts = t - PT
        image_row = (hs >= 0) & (hs < H)
        zero = tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty)
        out_row = out_ptr + row.to(tl.int64) * ROW
        if image_row & (ts >= TC) & (ts < TS):  # a row of x's frames: the norm kernel writes [LO, HI)
            if (start >= LO) & (start + BLOCK <= HI):
                return
            tl.store(out_row + j, zero, mask=in_row & ((j < LO) | (j >= HI)))
            return
        pixels = in_row & (j >= LO) & (j < HI)
        value = zero
        if HAS_CACHE:
            if image_row & (ts >= 0) & (ts < TC):
                value = tl.load(cache_ptr + b * sc0 + ts * sc2 + hs * sc3 + (j - LO), mask=pixels, other=0.0)
        tl.store(out_row + j, value, mask=in_row)
        slot = ts - (TS - 2)  # 0 or 1 in the next cache's two frames
        if image_row & (ts < TC) & (slot >= 0) & (slot < 2):
            tl.store(next_ptr + ((b * 2 + slot) * H + hs) * (HI - LO) + (j - LO), value, mask=pixels)

    @triton.jit
    def _conv_epilogue_kernel(y_ptr, bias_ptr, res_ptr, rb_ptr, dup_ptr, out_ptr, C, T, S, W, sy0, sy1, sy2, sys_, sr0,
                              sr1, sr2, srs, sd0, sd1, sd2, sd3, sd4, so0, so1, so2, sos, FIRST, REPEATS: tl.constexpr,
                              FT: tl.constexpr, FS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                              HAS_RES_BIAS: tl.constexpr, HAS_DUP: tl.constexpr, BLOCK_S: tl.constexpr,
                              BLOCK_C: tl.constexpr):
        """out = round(round(y + bias) + residual) (each part optional) with ATen's roundings (the conv's
        bias `add_`, then the residual add), for tensors whose (h, w) positions are one strided run of S
        (`s*s` strides): reads the channels-last conv output along c and writes the output (and reads the
        residual) in their own layouts. With HAS_DUP the residual is Wan 2.2's DupUp3D shortcut of `dup`
        (`_dup_up_add_kernel`'s gather; W is the output width). With HAS_RES_BIAS the residual is a conv
        output whose bias (at rb_ptr) was deferred: round(residual + bias) first, as ATen's `add_`. One (b, t)
        plane per program along axis 0, a BLOCK_S x BLOCK_C tile."""
        plane = tl.program_id(0)
        t32 = plane % T
        sp32 = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
        c32 = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        b = (plane // T).to(tl.int64)
        t = t32.to(tl.int64)
        sp = sp32.to(tl.int64)
        c = c32.to(tl.int64)
        mask = (sp < S)[:, None] & (c < C)[None, :]
        y = tl.load(y_ptr + (b * sy0 + t * sy2) + sp[:, None] * sys_ + c[None, :] * sy1, mask=mask, other=0.0)
        dtype = y.dtype
        acc = y.to(tl.float32)
        if HAS_BIAS:  # ATen's conv adds the bias with a separate add_: one rounding
            bias = tl.load(bias_ptr + c, mask=c < C, other=0.0).to(tl.float32)[None, :]
            acc = _round(acc + bias, dtype).to(tl.float32)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + (b * sr0 + t * sr2) + sp[:, None] * srs + c[None, :] * sr1, mask=mask, other=0.0)
            if HAS_RES_BIAS:
                rb = tl.load(rb_ptr + c, mask=c < C, other=0.0).to(tl.float32)[None, :]
                r = _round(r.to(tl.float32) + rb, dtype)
            acc = acc + r.to(tl.float32)
        if HAS_DUP:  # 32-bit index math (positions and channels fit), the factors known at compile time
            h = (sp32 // W)[:, None]
            w = (sp32 % W)[:, None]
            tf = t32 + FIRST
            channel = ((c32[None, :] * FT + tf % FT) * FS + h % FS) * FS + w % FS
            d = tl.load(dup_ptr + b * sd0 + (channel // REPEATS).to(tl.int64) * sd1 + (tf // FT).to(tl.int64) * sd2
                        + (h // FS).to(tl.int64) * sd3 + (w // FS).to(tl.int64) * sd4, mask=mask, other=0.0)
            acc = acc + d.to(tl.float32)
        tl.store(out_ptr + (b * so0 + t * so2) + sp[:, None] * sos + c[None, :] * so1, _round(acc, dtype), mask=mask)

    @triton.jit
    def _bias_residual_kernel(y_ptr, bias_ptr, res_ptr, out_ptr, numel, C, T, H, W,
                              sy0, sy1, sy2, sy3, sy4, sr0, sr1, sr2, sr3, sr4, so0, so1, so2, so3, so4,
                              HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < numel
        b, c, t, h, w = _position(i, C, T, H, W)
        y = tl.load(y_ptr + b * sy0 + c * sy1 + t * sy2 + h * sy3 + w * sy4, mask=mask, other=0.0)
        dtype = y.dtype
        acc = y.to(tl.float32)
        if HAS_BIAS:  # ATen's conv adds the bias with a separate add_: one rounding
            acc = _round(acc + tl.load(bias_ptr + c, mask=mask, other=0.0).to(tl.float32), dtype).to(tl.float32)
        r = tl.load(res_ptr + b * sr0 + c * sr1 + t * sr2 + h * sr3 + w * sr4, mask=mask, other=0.0)
        out = _round(acc + r.to(tl.float32), dtype)
        tl.store(out_ptr + b * so0 + c * so1 + t * so2 + h * so3 + w * so4, out, mask=mask)

    @triton.jit
    def _bias_residual_plane_kernel(y_ptr, bias_ptr, res_ptr, out_ptr, C, T, S, sy0, sy1, sy2, sr0, sr1, sr2,
                                    so0, so1, so2, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        """`_bias_residual_kernel` for tensors whose (h, w) planes are contiguous, one plane per program
        along axis 0 (see `_rms_norm_plane_kernel`). Same arithmetic, element for element."""
        b, c, t = _plane(tl.program_id(0), C, T)
        s = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = s < S
        y = tl.load(y_ptr + (b * sy0 + c * sy1 + t * sy2) + s, mask=mask, other=0.0)
        dtype = y.dtype
        acc = y.to(tl.float32)
        if HAS_BIAS:  # ATen's conv adds the bias with a separate add_: one rounding
            acc = _round(acc + tl.load(bias_ptr + c).to(tl.float32), dtype).to(tl.float32)
        r = tl.load(res_ptr + (b * sr0 + c * sr1 + t * sr2) + s, mask=mask, other=0.0)
        tl.store(out_ptr + (b * so0 + c * so1 + t * so2) + s, _round(acc + r.to(tl.float32), dtype), mask=mask)

    @triton.jit
    def _upsample2x_kernel(x_ptr, out_ptr, numel, C, HO, WO, sx0, sx1, sx2, sx3, so0, so1, so2, so3,
                           BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < numel
        n, c, _, h, w = _position(i, C, 1, HO, WO)
        value = tl.load(x_ptr + n * sx0 + c * sx1 + (h // 2) * sx2 + (w // 2) * sx3, mask=mask, other=0.0)
        tl.store(out_ptr + n * so0 + c * so1 + h * so2 + w * so3, value, mask=mask)

    @triton.jit
    def _upsample2x_cl_kernel(x_ptr, out_ptr, C, HO, WO, sx0, sx1, sx2, sx3, BLOCK_W: tl.constexpr,
                              BLOCK_C: tl.constexpr):
        """`_upsample2x_kernel` writing channels-last ([N, HO, WO, C] in memory): one output row (n, h) per
        program along axis 0, a BLOCK_W x BLOCK_C tile of it read along w and stored along c."""
        row = tl.program_id(0)
        n = (row // HO).to(tl.int64)
        h = row % HO
        w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (w < WO)[:, None] & (c < C)[None, :]
        value = tl.load(x_ptr + (n * sx0 + (h // 2) * sx2) + c[None, :].to(tl.int64) * sx1 + (w // 2)[:, None] * sx3,
                        mask=mask, other=0.0)
        tl.store(out_ptr + (row.to(tl.int64) * WO + w[:, None]) * C + c[None, :], value, mask=mask)

    @triton.jit
    def _dup_up_add_kernel(main_ptr, x_ptr, out_ptr, numel, C, T, H, W, REPEATS, FT, FS, FIRST,
                           sm0, sm1, sm2, sm3, sm4, sx0, sx1, sx2, sx3, sx4, so0, so1, so2, so3, so4,
                           BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < numel
        b, c, t, h, w = _position(i, C, T, H, W)
        tf = t + FIRST
        channel = ((c * FT + tf % FT) * FS + h % FS) * FS + w % FS
        src = x_ptr + b * sx0 + (channel // REPEATS) * sx1 + (tf // FT) * sx2 + (h // FS) * sx3 + (w // FS) * sx4
        d = tl.load(src, mask=mask, other=0.0)
        m = tl.load(main_ptr + b * sm0 + c * sm1 + t * sm2 + h * sm3 + w * sm4, mask=mask, other=0.0)
        out = _round(m.to(tl.float32) + d.to(tl.float32), m.dtype)
        tl.store(out_ptr + b * so0 + c * so1 + t * so2 + h * so3 + w * so4, out, mask=mask)


def _grid(numel: int) -> tuple[int]:
    return (triton.cdiv(numel, BLOCK),)


def _launch(kernel, numel: int, *args, **constexprs) -> None:
    if numel:
        kernel[_grid(numel)](*args, BLOCK=BLOCK, enable_fp_fusion=False, **constexprs)


def _as5d(t: Tensor) -> Tensor:
    return t.unsqueeze(2) if t.dim() == 4 else t


def _planes_contiguous(*tensors: Tensor) -> bool:
    """Every 5-D tensor's (h, w) plane is one contiguous run (the plane kernels' precondition)."""
    return all(t.shape[3] * t.shape[4] <= 1 or (t.stride(4) == 1 and (t.shape[3] == 1 or t.stride(3) == t.shape[4]))
               for t in tensors)


def _plane_grid(b: int, c: int, t: int, spatial: int) -> tuple[int, int]:
    return (b * c * t, triton.cdiv(spatial, BLOCK))


_LAYOUTS: dict[tuple, tuple[int, ...]] = {}


def reference_layout(key: tuple, fn: Callable, *tensors: Tensor) -> tuple[int, ...]:
    """The strides ATen gives `fn(*tensors)`'s output, computed once per `key` and layout on meta tensors.

    `key` names what `fn` computes (its non-tensor arguments included): `fn` itself may be a new lambda
    on every call.
    """
    signature = key + tuple((tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors)
    strides = _LAYOUTS.get(signature)
    if strides is None:
        metas = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in tensors]
        strides = _LAYOUTS[signature] = tuple(fn(*metas).stride())
    return strides


FUSED_NORM = True  # the one-kernel norm where `aten_reduction.plan` reproduces ATen's order (A/B switch)


MAX_NORM_THREADS = 64  # split x padded ctas rows of accumulators the fused norm holds (4 each): Wan's <= 4 x 16


def norm_plan(x: Tensor, upcast: bool, reference_contiguous: bool = False):
    """ATen's summation order for this CUDA norm input, or None (then ATen's reduction kernel runs).
    `reference_contiguous`: x stands in for a contiguous tensor (`aten_reduction.plan`); its (h, w) positions
    need only be one strided run."""
    if not FUSED_NORM or not x.is_cuda or (x.dtype != torch.float32) != upcast:
        return None
    x5 = _as5d(x)
    if not (_run_stride(x5) is not None if reference_contiguous else _planes_contiguous(x5)):
        return None
    plan = aten_reduction.plan(x, torch.float32, reference_contiguous)
    return None if plan is None or _norm_threads(plan.split, plan.ctas) > MAX_NORM_THREADS else plan


def _norm_threads(split: int, ctas: int) -> int:
    """Rows of ATen threads the fused norm emulates per pixel: split x ctas padded to a power of 2."""
    return split * triton.next_power_of_2(ctas)


NORM_TILE = 1024  # accumulator values per program of the fused norm (8 fp32 registers a thread at 4 warps;
# H200 sweep, bf16: 367 against 421 us at 2048 for 96 channels x 4 x 480 x 832, 187 against 229 for 192 x 4 x 240 x 416)
NORM_WARPS = 4
NORM_UNROLL = 2  # channel groups loaded per step of the first pass (H200, bf16, norm into the padded input:
# 860 against 884 us for 256 x 4 x 360 x 640, 494 against 510 for 512 x 4 x 180 x 320, 989 against 1020 for
# 1024 x 4 x 180 x 320; 1 and 4 within 1% of each other)
NORM_WARPS_WIDE = 8  # 256 channels and more over large planes
NORM_STORE_CHANNELS = 64  # channels per step of the second pass where the channel count is a multiple
# H200 sweep, bf16, norm into the padded input: 919 against 960 us for 256 x 4 x 360 x 640, 526 against 554 for
# 512 x 4 x 180 x 320, 1059 against 1133 for 1024 x 4 x 180 x 320 (2 blocks), 257 against 304 for 1024 x 2 x 90 x 160
# (10 blocks, 64 pixels), 83 against 134 for 1024 x 45 x 80 (16 blocks, 16 pixels); ATen's norm + pad: 2010, 317, 364


def _pixels_block(threads: int, pixels: int, ctas: int = 1) -> int:
    """Pixels per program of the fused norm: a [4 threads, pixels] fp32 accumulator of NORM_TILE values (at
    least 32 pixels); where a plane is too small to fill the GPU with large blocks, 32 (16 or 64 for a
    cross-block order, whose rows are many)."""
    if pixels < 16 * 1024:
        return 32 if ctas == 1 else 16 if pixels < 8 * 1024 else 64
    return max(32, min(512, NORM_TILE // (4 * threads)))


def _norm_constexprs(split: int, ctas: int, channels: int, pixels: int) -> dict:
    """The fused norm kernels' compile-time tiling for one input."""
    threads = _norm_threads(split, ctas)
    group = NORM_STORE_CHANNELS if channels % NORM_STORE_CHANNELS == 0 else 4 * split
    return dict(SPLIT=split, CTAS=ctas, CTAS_P2=triton.next_power_of_2(ctas), BLOCK_P=_pixels_block(threads, pixels, ctas),
                GROUP=max(4 * split, group), UNROLL=NORM_UNROLL)


def _norm_warps(channels: int, pixels: int) -> int:
    return NORM_WARPS_WIDE if channels >= 256 and pixels >= 16 * 1024 else NORM_WARPS


def channel_norm(x: Tensor, split: int, ctas: int = 1) -> Tensor:
    """fp32 L2 norm over dim 1 in ATen's order for `split` threads in `ctas` blocks (see `aten_reduction`),
    shape [B, 1, T, H, W]. x's (h, w) planes must be contiguous."""
    x5 = _as5d(x)
    b, c, t, h, w = x5.shape
    norm = torch.empty((b, 1, t, h, w), dtype=torch.float32, device=x.device)
    constexprs = _norm_constexprs(split, ctas, c, h * w)
    if norm.numel():
        constexprs.pop("GROUP")
        _channel_norm_kernel[(b * t, triton.cdiv(h * w, constexprs["BLOCK_P"]))](
            x5, norm, c, t, h * w, *x5.stride()[:3], **constexprs, enable_fp_fusion=False)
    return norm.view([b, 1, *x.shape[2:]])


def rms_norm_fused(x: Tensor, gamma: Tensor, scale: float, bias: float, eps: float, upcast: bool, silu: bool,
                   split: int, ctas: int = 1) -> Tensor:
    """The whole Wan RMS norm (+ SiLU when `silu`) in one kernel whose channel sums follow ATen's order for
    `split` threads in `ctas` blocks (`aten_reduction.plan`): reads x twice (the second time mostly from L2), writes the output once.
    x's (h, w) planes must be contiguous (contiguous and frame-major layouts)."""
    from rewrite.ops.wan import rms_norm_reference

    strides = reference_layout(("rms_norm", upcast, None),
                               lambda a, g: rms_norm_reference(a, g, 1.0, 0.0, 1e-12, upcast, None), x, gamma)
    out = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)
    x5, o5 = _as5d(x), _as5d(out)
    b, c, t, h, w = x5.shape
    if not _planes_contiguous(x5, o5):
        raise ValueError("rms_norm_fused: x and the output need contiguous (h, w) planes")
    constexprs = _norm_constexprs(split, ctas, c, h * w)
    if out.numel():
        _rms_norm_fused_kernel[(b * t, triton.cdiv(h * w, constexprs["BLOCK_P"]))](
            x5, gamma, o5, c, t, h * w, *x5.stride()[:3], *o5.stride()[:3], float(scale), float(bias), float(eps),
            UPCAST=upcast, SILU=silu, **constexprs, enable_fp_fusion=False, num_warps=_norm_warps(c, h * w))
    return out


def rms_norm(x: Tensor, gamma: Tensor, scale: float, bias: float, eps: float, upcast: bool,
             act: str | None, fused_silu: bool = True) -> Tensor:
    """The Wan RMS norm: `rms_norm_fused` where `aten_reduction` knows ATen's order for x; else ATen's
    reduction, then one epilogue kernel. SiLU is folded in when `fused_silu`, else applied by ATen after."""
    from rewrite.ops.wan import rms_norm_reference

    silu_here = act == "silu" and fused_silu
    plan = norm_plan(x, upcast)
    if plan is not None:
        out = rms_norm_fused(x, gamma, scale, bias, eps, upcast, silu_here, plan.split, plan.ctas)
        return torch.nn.functional.silu(out) if act == "silu" and not fused_silu else out
    strides = reference_layout(("rms_norm", upcast, act),
                               lambda a, g: rms_norm_reference(a, g, 1.0, 0.0, 1e-12, upcast, act), x, gamma)
    xf = x.float() if upcast else x
    norm = torch.linalg.vector_norm(xf, 2, [1], True).contiguous()
    out = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)
    x5, o5, n5 = _as5d(x), _as5d(out), _as5d(norm)
    b, c, t, h, w = x5.shape
    if out.numel() and _planes_contiguous(x5, o5):
        _rms_norm_plane_kernel[_plane_grid(b, c, t, h * w)](
            x5, n5, gamma, o5, c, t, h * w, *x5.stride()[:3], *o5.stride()[:3], float(scale), float(bias),
            float(eps), UPCAST=upcast, SILU=silu_here, BLOCK=BLOCK, enable_fp_fusion=False)
    else:
        _launch(_rms_norm_epilogue_kernel, out.numel(), x5, n5, gamma, o5, out.numel(), c, t, h, w,
                *x5.stride(), *o5.stride(), float(scale), float(bias), float(eps), UPCAST=upcast, SILU=silu_here)
    if act == "silu" and not fused_silu:
        out = torch.nn.functional.silu(out)
    return out


def silu(x: Tensor) -> Tensor:
    """SiLU of a contiguous tensor with the norm kernel's formula (for the exhaustive self-test)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _launch(_silu_kernel, x.numel(), x, out, x.numel())
    return out


def causal_pad(x: Tensor, cache: Tensor | None, pad: list[int]) -> Tensor:
    """`pad(cat([cache, x], 2), pad)` (or `pad(x, pad)`) as one contiguous tensor written once."""
    wl, wr, hl, hr, tl_, tr = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    out = x.new_empty((b, c, tl_ + tc + tx + tr, hl + h + hr, wl + w + wr))
    source = x if cache is None else cache
    _, _, frames_out, rows_out, columns_out = out.shape
    if out.numel():
        block_w = min(triton.next_power_of_2(columns_out), PAD_TILE)
        rows_per_program = max(1, PAD_TILE // block_w)
        h_blocks = triton.cdiv(rows_out, rows_per_program)
        grid = (b * c * frames_out * h_blocks, triton.cdiv(columns_out, block_w))
        _causal_pad_kernel[grid](x, source, out, c, frames_out, rows_out, columns_out, tc, tx, h, w, tl_, hl, wl,
                                 h_blocks, *x.stride(), *source.stride(), HAS_CACHE=cache is not None,
                                 ROWS=rows_per_program, BLOCK_W=block_w, num_warps=4)
    return out


# Tiles of the channels-last data-movement kernels: (positions along w or (h, w), channels, warps); channels
# 0 means `_channel_block`. From an H200 sweep (bf16, Wan 2.1 480p shapes): the pad kernel with 96 channels
# 540 -> 356 us as one 128-channel block at 8 warps (192 and 384 channels: 64 at 4 warps is as good), the
# epilogue 242 -> 227 us at (128, 64, 8), the upsample within 3% of its best at (64, 0, 4).
PAD_CL_TILE = (64, 0, 4)
PAD_CL_TILE_FEW_CHANNELS = (64, 128, 8)  # up to 128 channels: all in one block
EPILOGUE_TILE = (128, 64, 8)
DUP_UP_EPILOGUE_TILE = (128, 64, 8)  # with the DupUp3D gather
UPSAMPLE_CL_TILE = (64, 0, 4)


def _channel_block(channels: int, fixed: int = 0) -> int:
    if fixed:
        return fixed
    return 64 if channels % 64 == 0 or channels > 256 else 32


def _padded_channels_last(x: Tensor, cache: Tensor | None, pad: list[int]) -> tuple[Tensor, Tensor]:
    """Empty (padded input, next cache), channels-last, for `causal_pad_channels_last`."""
    wl, wr, hl, hr, tl_, tr = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    if tl_ + tc + tx < 2:
        raise ValueError(f"causal_pad_channels_last: {tl_ + tc + tx} frames before the right pad, the cache needs 2")
    shape = (b, c, tl_ + tc + tx + tr, hl + h + hr, wl + w + wr)
    out = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    next_cache = torch.empty((b, c, 2, h, w), dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    return out, next_cache


PAD_REST_BLOCK = (8192, 8)  # values per program, warps: `_causal_pad_rest_cl_kernel`


def causal_pad_rest_channels_last(x: Tensor, cache: Tensor | None, pad: list[int]) -> tuple[Tensor, Tensor]:
    """`causal_pad_channels_last` without the positions that come from x (nor their next-cache copies):
    `rms_norm_padded_channels_last` has the norm kernel write those. The cache is read channels-last (copied
    so first if it is not)."""
    out, next_cache = _padded_channels_last(x, cache, pad)
    wl, _, hl, _, tl_, _ = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    if cache is not None and (cache.stride(1) != 1 or cache.stride(4) != c):  # (w, c) of a row not one run
        cache = cache.contiguous(memory_format=torch.channels_last_3d)
    source = out if cache is None else cache  # not read without a cache
    _, _, frames_out, rows_out, columns_out = out.shape
    if out.numel():
        row = columns_out * c
        block, warps = PAD_REST_BLOCK
        _causal_pad_rest_cl_kernel[(b * frames_out * rows_out, triton.cdiv(row, block))](
            source, out, next_cache, frames_out, rows_out, h, tc, tl_, hl, tc + tx, row, wl * c, (wl + w) * c,
            source.stride(0), source.stride(2), source.stride(3), HAS_CACHE=cache is not None, BLOCK=block,
            num_warps=warps)
    return out, next_cache


def causal_pad_channels_last(x: Tensor, cache: Tensor | None, pad: list[int]) -> tuple[Tensor, Tensor]:
    """(`pad(cat([cache, x], 2), pad)` (or `pad(x, pad)`), its last two frames before the right pad without the
    spatial pad) written in one pass, both channels-last (NDHWC memory). The second is the next chunk's cache
    in every mode of `rewrite.ops.wan.next_cache_reference` (its values; its layout is channels-last)."""
    wl, _, hl, _, tl_, _ = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    out, next_cache = _padded_channels_last(x, cache, pad)
    source = x if cache is None else cache
    _, _, frames_out, rows_out, columns_out = out.shape
    if out.numel():
        block_w, block_c, warps = PAD_CL_TILE_FEW_CHANNELS if c <= PAD_CL_TILE_FEW_CHANNELS[1] else PAD_CL_TILE
        block_c = _channel_block(c, block_c)
        grid = (b * frames_out * rows_out, triton.cdiv(columns_out, block_w), triton.cdiv(c, block_c))
        _causal_pad_cl_kernel[grid](x, source, out, next_cache, c, frames_out, rows_out, columns_out, tc, h, w, tl_,
                                    hl, wl, tc + tx, *x.stride(), *source.stride(), HAS_CACHE=cache is not None,
                                    BLOCK_W=block_w, BLOCK_C=block_c, num_warps=warps)
    return out, next_cache


def rms_norm_padded_channels_last(x: Tensor, gamma: Tensor, scale: float, bias: float, eps: float, upcast: bool,
                                  silu: bool, split: int, cache: Tensor | None, pad: list[int],
                                  ctas: int = 1, x_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`causal_pad_channels_last(rms_norm(x [+ x_bias]), cache, pad)` without materializing the norm: the norm
    kernel stores into the padded buffer and the next cache, the pad kernel writes only the rest (cache frames,
    zero pad). x's (h, w) positions must be one strided run (contiguous planes, or channels-last); `split`,
    `ctas` are `aten_reduction`'s plan for the layout whose summation order the norm must follow. `x_bias`: x
    is a conv output whose bias was deferred; the norm's input is `x.add_(x_bias)` (ATen's rounding)."""
    pixel_stride = _run_stride(x)
    if pixel_stride is None:
        raise ValueError(f"rms_norm_padded_channels_last: x's (h, w) positions are not one strided run {x.stride()}")
    out, next_cache = causal_pad_rest_channels_last(x, cache, pad)
    if not out.numel():
        return out, next_cache
    wl, _, hl, _, tl_, _ = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    _, _, frames_out, rows_out, columns_out = out.shape
    constexprs = _norm_constexprs(split, ctas, c, h * w)
    _rms_norm_padded_kernel[(b * tx, triton.cdiv(h * w, constexprs["BLOCK_P"]))](
        x, x if x_bias is None else x_bias, gamma, out, next_cache, c, tx, h * w, w, *x.stride()[:3], pixel_stride,
        frames_out, rows_out, columns_out, tl_ + tc, hl, wl, tx - 2, float(scale), float(bias), float(eps),
        UPCAST=upcast, SILU=silu, HAS_XBIAS=x_bias is not None, **constexprs, enable_fp_fusion=False,
        num_warps=_norm_warps(c, h * w))
    return out, next_cache


def _run_stride(t: Tensor) -> int | None:
    """The stride of a 5-D tensor's (h, w) positions as one run (h stride = W * w stride), else None."""
    _, _, _, h, w = t.shape
    if h == 1:
        return t.stride(4)
    if w == 1:
        return t.stride(3)
    return t.stride(4) if t.stride(3) == w * t.stride(4) else None


def conv_epilogue(y: Tensor, bias: Tensor | None, residual: Tensor | None, out_strides: tuple[int, ...],
                  dup_up: tuple[Tensor, int, int, int, int] | None = None,
                  residual_bias: Tensor | None = None) -> Tensor:
    """`y.add_(bias) [+ residual]` with ATen's roundings into a new tensor of `out_strides` (y is a conv
    output without its bias, any layout whose (h, w) positions form one strided run). `dup_up` =
    (x, repeats, factor_t, factor_s, first_frame) adds `DupUp3D(x)[:, :, first_frame:]` as the residual
    (`dup_up_add`'s gather; not with `residual`). `residual_bias`: the residual is a conv output without its
    bias, added first (`residual.add_(residual_bias)`'s rounding)."""
    if residual is not None and dup_up is not None:
        raise ValueError("conv_epilogue: a residual or a DupUp3D shortcut, not both")
    if residual_bias is not None and residual is None:
        raise ValueError("conv_epilogue: residual_bias without a residual")
    out = torch.empty_strided(y.shape, out_strides, dtype=y.dtype, device=y.device)
    res = residual if residual is not None else out
    runs = [_run_stride(t) for t in (y, res, out)]
    if None in runs:
        raise ValueError(f"conv_epilogue: (h, w) not one strided run in strides {[t.stride() for t in (y, res, out)]}")
    dup, repeats, factor_t, factor_s, first = dup_up if dup_up is not None else (out, 1, 1, 1, 0)
    b, c, t, h, w = y.shape
    if out.numel():
        block_s, block_c, warps = EPILOGUE_TILE if dup_up is None else DUP_UP_EPILOGUE_TILE
        block_c = _channel_block(c, block_c)
        grid = (b * t, triton.cdiv(h * w, block_s), triton.cdiv(c, block_c))
        _conv_epilogue_kernel[grid](y, y if bias is None else bias, res, res if residual_bias is None else residual_bias,
                                    dup, out, c, t, h * w, w,
                                    *y.stride()[:3], runs[0], *res.stride()[:3], runs[1], *dup.stride(),
                                    *out.stride()[:3], runs[2], first, REPEATS=repeats, FT=factor_t, FS=factor_s,
                                    HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
                                    HAS_RES_BIAS=residual_bias is not None, HAS_DUP=dup_up is not None,
                                    BLOCK_S=block_s, BLOCK_C=block_c, enable_fp_fusion=False, num_warps=warps)
    return out


def bias_residual(y: Tensor, bias: Tensor | None, residual: Tensor) -> Tensor:
    """`y.add_(bias) + residual` with ATen's two roundings (y is a conv output without its bias)."""
    strides = reference_layout(("add",), torch.add, y, residual)
    out = torch.empty_strided(y.shape, strides, dtype=y.dtype, device=y.device)
    b, c, t, h, w = y.shape
    if out.numel() and _planes_contiguous(y, residual, out):
        _bias_residual_plane_kernel[_plane_grid(b, c, t, h * w)](
            y, y if bias is None else bias, residual, out, c, t, h * w, *y.stride()[:3], *residual.stride()[:3],
            *out.stride()[:3], HAS_BIAS=bias is not None, BLOCK=BLOCK, enable_fp_fusion=False)
    else:
        _launch(_bias_residual_kernel, out.numel(), y, y if bias is None else bias, residual, out, out.numel(),
                c, t, h, w, *y.stride(), *residual.stride(), *out.stride(), HAS_BIAS=bias is not None)
    return out


def upsample_nearest2x(x: Tensor, upcast: bool) -> Tensor:
    """Nearest-exact 2x of [N, C, H, W] (pixel duplication) from any strides, in the layout ATen's op gives."""
    from rewrite.ops.wan import upsample_nearest2x_reference

    n, c, h, w = x.shape
    strides = reference_layout(("upsample_nearest2x", upcast), lambda a: upsample_nearest2x_reference(a, upcast), x)
    out = torch.empty_strided((n, c, 2 * h, 2 * w), strides, dtype=x.dtype, device=x.device)
    _launch(_upsample2x_kernel, out.numel(), x, out, out.numel(), c, 2 * h, 2 * w, *x.stride(), *out.stride())
    return out


def upsample_nearest2x_channels_last(x: Tensor) -> Tensor:
    """Nearest-exact 2x of [N, C, H, W] (pixel duplication) from any strides, written channels-last."""
    n, c, h, w = x.shape
    out = torch.empty((n, c, 2 * h, 2 * w), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if out.numel():
        block_w, block_c, warps = UPSAMPLE_CL_TILE
        block_c = _channel_block(c, block_c)
        grid = (n * 2 * h, triton.cdiv(2 * w, block_w), triton.cdiv(c, block_c))
        _upsample2x_cl_kernel[grid](x, out, c, 2 * h, 2 * w, *x.stride(), BLOCK_W=block_w, BLOCK_C=block_c,
                                    num_warps=warps)
    return out


def dup_up_add(main: Tensor, x: Tensor, repeats: int, factor_t: int, factor_s: int, first_frame: int) -> Tensor:
    """`main + DupUp3D(x)[:, :, first_frame:]` gathered in one pass."""
    strides = reference_layout(("add_contiguous",), lambda a: a + torch.empty_like(a, memory_format=torch.contiguous_format), main)
    out = torch.empty_strided(main.shape, strides, dtype=main.dtype, device=main.device)
    b, c, t, h, w = main.shape
    _launch(_dup_up_add_kernel, out.numel(), main, x, out, out.numel(), c, t, h, w, repeats, factor_t, factor_s,
            first_frame, *main.stride(), *x.stride(), *out.stride())
    return out
