"""Winograd F(2x2, 3x3) conv3d with the input transform written to memory: two Triton kernels.

Computes what `rewrite.kernels.winograd.winograd.winograd_conv3d_channels_last` computes, with the same arithmetic
(input transform in fp32 rounded once to the activation dtype, fp32 GEMM sums, fp32 output transform, bias and
residual, one rounding; exactness: tolerance, level ``channels_last``), in two steps:

1. `_input_transform_kernel`: every 4x4 patch (stride 2) of every padded input frame, transformed (``B^T d B``),
   written as ``V`` [16, B * Tp * TH * TW, C] (point-major; the patches of a frame in row-major block order).
   ``V`` is 4x the padded input: the price of step 2 reading plain 2-D tiles (`WinogradTile.transform_frames`
   bounds it to a few frames of one batch element, at the cost of transforming the frames chunks share again).
2. `_point_gemm_kernel`: a program computes ``BLOCK_M`` 2x2 output blocks of one output frame by ``BLOCK_N``
   channels. For each of the 16 points (a runtime loop) it runs one GEMM over taps x channels, its operands
   loaded by TMA (``V``'s rows of frame t + tap, the transformed weight's [BLOCK_K, BLOCK_N] slice) in a
   loop Triton pipelines, and adds the point's fp32 sum into the four outputs with the output transform's
   coefficients; only five ``[BLOCK_M, BLOCK_N]`` accumulators live at a time. Rows of a block past its
   frame's last patch read the next frame's patches (or TMA's zero fill): those outputs are masked. With
   `WinogradTile.one_loop` the 16 points' GEMMs are one pipelined loop (the add at each point's last step), so
   the loads run ahead across point boundaries. With `WinogradTile.split_output` a program runs one point's GEMM
   with one accumulator and stores its fp32 sums to ``M`` [16, output blocks, O]; a third kernel applies the
   output transform, bias and residual (the same arithmetic; ``M`` is 8x the output in memory).

Against the fused form, step 2 is an ordinary pipelined tensor-core GEMM (no pixel arithmetic between the
loads and the MMA, so the operands go through shared memory); the cost is ``V``'s write and reads, and its
memory (a temporary of 4x the padded input). Which form is faster per shape is the sweep's to say
(`python -m rewrite.tools.sweep_winograd`).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rewrite.kernels.launch import launch
from rewrite.kernels.winograd.transforms import POINTS
from rewrite.kernels.winograd.common import WinogradTile, checked_shape
from rewrite.ops.dispatch import triton

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - a Triton without host tensor descriptors
    TensorDescriptor = None

ALIGNMENT = 8  # TMA: row strides of 16 bytes, i.e. channel counts a multiple of 8 in bf16/fp16


def unsupported_reason(in_channels: int, out_channels: int) -> Optional[str]:
    """Why the TMA form cannot serve these channel counts (beyond `winograd.unsupported_reason`), or None."""
    if TensorDescriptor is None:
        return "triton with tensor descriptors is not importable"
    if in_channels % ALIGNMENT or out_channels % ALIGNMENT:
        return f"{in_channels} -> {out_channels} channels (TMA needs multiples of {ALIGNMENT})"
    return None


if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import dot as _dot
    from rewrite.kernels.aten_math import round_to as _round
    from rewrite.kernels.winograd.common import add_point, output_program, patch_origin, store_block

    @triton.jit
    def _pixel(x_ptr, base, row_ok, v, k, k_ok, WP, C, tx_col):
        """fp32 [BLOCK_M, BLOCK_C] of patch column v in the row at `base` (zero past the plane's edge)."""
        mask = (row_ok & (tx_col + v < WP))[:, None] & k_ok[None, :]
        return tl.load(x_ptr + (base + v * C)[:, None] + k[None, :], mask=mask, other=0.0).to(tl.float32)

    @triton.jit
    def _patch_row(x_ptr, pixel, rows_ok, u, k, k_ok, WP, HP, C, ty_row, tx_col):
        """Row u of each block's 4x4 patch transformed along the columns (d0 - d2, d1 + d2, d2 - d1, d1 - d3)."""
        row_ok = rows_ok & (ty_row + u < HP)
        base = (pixel + u * WP) * C
        d0 = _pixel(x_ptr, base, row_ok, 0, k, k_ok, WP, C, tx_col)
        d1 = _pixel(x_ptr, base, row_ok, 1, k, k_ok, WP, C, tx_col)
        d2 = _pixel(x_ptr, base, row_ok, 2, k, k_ok, WP, C, tx_col)
        d3 = _pixel(x_ptr, base, row_ok, 3, k, k_ok, WP, C, tx_col)
        return d0 - d2, d1 + d2, d2 - d1, d1 - d3

    @triton.jit
    def _store_column(v_ptr, e0, e1, e2, e3, s: tl.constexpr, point_stride, rows, k, mask):
        """Points (0..3, s): B^T's rows applied along the patch rows (e0 - e2, e1 + e2, e2 - e1, e1 - e3)."""
        offsets = rows[:, None] + k[None, :]
        dtype = v_ptr.dtype.element_ty
        tl.store(v_ptr + s * point_stride + offsets, _round(e0 - e2, dtype), mask=mask)
        tl.store(v_ptr + (4 + s) * point_stride + offsets, _round(e1 + e2, dtype), mask=mask)
        tl.store(v_ptr + (8 + s) * point_stride + offsets, _round(e2 - e1, dtype), mask=mask)
        tl.store(v_ptr + (12 + s) * point_stride + offsets, _round(e1 - e3, dtype), mask=mask)

    @triton.jit
    def _input_transform_kernel(x_ptr, v_ptr, C, HP, WP, TH, TW, PATCHES, POINT_STRIDE,
                                BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        k = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        k_ok = k < C
        rows_ok, frame, ty_row, tx_col = patch_origin(m, PATCHES, TH, TW)  # frame: b * Tp + t of the padded input
        m = tl.where(rows_ok, m, 0).to(tl.int64)
        pixel = (frame * HP + ty_row) * WP + tx_col
        a0, a1, a2, a3 = _patch_row(x_ptr, pixel, rows_ok, 0, k, k_ok, WP, HP, C, ty_row, tx_col)
        b0, b1, b2, b3 = _patch_row(x_ptr, pixel, rows_ok, 1, k, k_ok, WP, HP, C, ty_row, tx_col)
        c0, c1, c2, c3 = _patch_row(x_ptr, pixel, rows_ok, 2, k, k_ok, WP, HP, C, ty_row, tx_col)
        d0, d1, d2, d3 = _patch_row(x_ptr, pixel, rows_ok, 3, k, k_ok, WP, HP, C, ty_row, tx_col)
        rows = m * C
        mask = rows_ok[:, None] & k_ok[None, :]
        point_stride = POINT_STRIDE.to(tl.int64)  # 16 x the stride passes 2**31 at 720p
        _store_column(v_ptr, a0, b0, c0, d0, 0, point_stride, rows, k, mask)
        _store_column(v_ptr, a1, b1, c1, d1, 1, point_stride, rows, k, mask)
        _store_column(v_ptr, a2, b2, c2, d2, 2, point_stride, rows, k, mask)
        _store_column(v_ptr, a3, b3, c3, d3, 3, point_stride, rows, k, mask)

    @triton.jit
    def _operands(v_desc, u_desc, point, tap, c0, b, t, m0, n0, C, KT, TP, FRAME_PATCHES, ALL_PATCHES):
        """One GEMM step's TMA loads: ``V``'s [BLOCK_M, BLOCK_K] rows of padded frame t + tap for `point`, and the
        transformed weight's [BLOCK_K, BLOCK_N] slice of (point, tap)."""
        a = v_desc.load([point * ALL_PATCHES + (b * TP + t + tap) * FRAME_PATCHES + m0, c0])
        wt = u_desc.load([(point * KT + tap) * C + c0, n0])
        return a, wt

    @triton.jit
    def _point_sum(v_desc, u_desc, point, b, t, m0, n0, C, KT, TP, FRAME_PATCHES, ALL_PATCHES,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
        """`point`'s fp32 GEMM sum over taps x channels for one block of outputs, as a pipelined loop."""
        c_blocks = tl.cdiv(C, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for step in tl.range(KT * c_blocks, num_stages=STAGES):
            tap = step // c_blocks
            a, wt = _operands(v_desc, u_desc, point, tap, (step % c_blocks) * BLOCK_K, b, t, m0, n0, C, KT, TP,
                              FRAME_PATCHES, ALL_PATCHES)
            acc = _dot(a, wt, acc)
        return acc

    @triton.jit
    def _point_gemm_kernel(v_desc, u_desc, bias_ptr, res_ptr, out_ptr, C, O, KT, T, H, W, TP, TW, FRAME_PATCHES,
                           ALL_PATCHES, N_BLOCKS, so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w,
                           HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                           ONE_LOOP: tl.constexpr):
        frame = tl.program_id(1)  # b * T + t of the output
        b = frame // T
        t = frame % T
        m0 = (tl.program_id(0) // N_BLOCKS) * BLOCK_M  # the first patch of the block within its frame
        n0 = (tl.program_id(0) % N_BLOCKS) * BLOCK_N
        y00 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        y01 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        y10 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        y11 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        if ONE_LOOP:  # the 16 points' GEMMs as one pipelined loop: the loads run ahead across point boundaries
            c_blocks = tl.cdiv(C, BLOCK_K)
            steps = KT * c_blocks
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for step in tl.range(16 * steps, num_stages=STAGES):
                point = step // steps
                inner = step - point * steps
                tap = inner // c_blocks
                a, wt = _operands(v_desc, u_desc, point, tap, (inner - tap * c_blocks) * BLOCK_K, b, t, m0, n0, C,
                                  KT, TP, FRAME_PATCHES, ALL_PATCHES)
                acc = _dot(a, wt, acc)
                if inner == steps - 1:
                    y00, y01, y10, y11 = add_point(acc, point, y00, y01, y10, y11)
                    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        else:
            for point in range(16):  # a runtime loop, as in the fused form
                acc = _point_sum(v_desc, u_desc, point, b, t, m0, n0, C, KT, TP, FRAME_PATCHES, ALL_PATCHES, BLOCK_M,
                                 BLOCK_N, BLOCK_K, STAGES)
                y00, y01, y10, y11 = add_point(acc, point, y00, y01, y10, y11)
        m = m0 + tl.arange(0, BLOCK_M)
        n = n0 + tl.arange(0, BLOCK_N)
        rows_ok = m < FRAME_PATCHES
        n_ok = n < O
        h0 = 2 * (m // TW)
        w0 = 2 * (m % TW)
        b = b.to(tl.int64)
        t = t.to(tl.int64)
        store_block(y00, y01, y10, y11, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok, rows_ok, H, W, so_b,
                    so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)

    @triton.jit
    def _point_gemm_split_kernel(v_desc, u_desc, m_ptr, C, O, KT, T, TP, FRAME_PATCHES, ALL_PATCHES, OUT_PATCHES,
                                 N_BLOCKS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 STAGES: tl.constexpr):
        """One point's GEMM for `BLOCK_M` 2x2 blocks of one output frame by `BLOCK_N` channels, its fp32 sum
        stored to ``M`` [16, B * T * FRAME_PATCHES, O] (one accumulator: the split form's first kernel)."""
        frame = tl.program_id(1)  # b * T + t of the output
        point = tl.program_id(2)
        b = frame // T
        t = frame % T
        m0 = (tl.program_id(0) // N_BLOCKS) * BLOCK_M
        n0 = (tl.program_id(0) % N_BLOCKS) * BLOCK_N
        acc = _point_sum(v_desc, u_desc, point, b, t, m0, n0, C, KT, TP, FRAME_PATCHES, ALL_PATCHES, BLOCK_M, BLOCK_N,
                         BLOCK_K, STAGES)
        m = m0 + tl.arange(0, BLOCK_M)
        n = n0 + tl.arange(0, BLOCK_N)
        rows = point.to(tl.int64) * OUT_PATCHES + frame.to(tl.int64) * FRAME_PATCHES + m
        mask = (m < FRAME_PATCHES)[:, None] & (n < O)[None, :]
        tl.store(m_ptr + rows[:, None] * O + n[None, :], acc, mask=mask)

    @triton.jit
    def _output_transform_kernel(m_ptr, bias_ptr, res_ptr, out_ptr, O, T, H, W, TW, FRAME_PATCHES, OUT_PATCHES,
                                 so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w,
                                 HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                                 BLOCK_N: tl.constexpr):
        """The output transform of ``M``'s 16 fp32 sums for `BLOCK_M` 2x2 blocks of one output frame by `BLOCK_N`
        channels, then bias, residual and one rounding (`store_block`): the split form's second kernel."""
        frame, m, n, rows_ok, n_ok, mask, rows = output_program(FRAME_PATCHES, O, BLOCK_M, BLOCK_N)
        y00 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        y01 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        y10 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        y11 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for point in range(16):
            offsets = (point * OUT_PATCHES + rows)[:, None] * O + n[None, :]
            y00, y01, y10, y11 = add_point(tl.load(m_ptr + offsets, mask=mask, other=0.0), point, y00, y01, y10, y11)
        b = (frame // T).to(tl.int64)
        t = (frame % T).to(tl.int64)
        store_block(y00, y01, y10, y11, out_ptr, res_ptr, bias_ptr, b, t, 2 * (m // TW), 2 * (m % TW), n, n_ok,
                    rows_ok, H, W, so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)


def transform_blocks(channels: int) -> tuple[int, int]:
    """`input_transform`'s default (patches, channels) per program: 2048 values, 128 channels where C has them."""
    block_c = 128 if channels >= 128 else 64
    return 2048 // block_c, block_c


def input_transform(padded: Tensor, block_m: Optional[int] = None, block_c: Optional[int] = None) -> Tensor:
    """``V`` of the module docstring for a channels-last padded input: [16, B * Tp * TH * TW, C], its dtype.
    A program transforms `block_m` patches by `block_c` channels; by default 2048 values, 128 channels where C
    has them (else 64): on the H100, 16 x 128 ran 1.6-1.8x faster than 32 x 32 at 256-1024 channels
    (docs/tuning.md 1.19)."""
    batch, channels, tp, hp, wp = padded.shape
    default_m, default_c = transform_blocks(channels)
    block_m, block_c = block_m or default_m, block_c or default_c
    rows, columns = (hp - 1) // 2, (wp - 1) // 2  # blocks of the unpadded plane: ceil((hp - 2) / 2)
    patches = batch * tp * rows * columns
    v = torch.empty(POINTS, patches, channels, dtype=padded.dtype, device=padded.device)
    grid = (triton.cdiv(patches, block_m), triton.cdiv(channels, block_c))
    launch(_input_transform_kernel, grid, padded, v, channels, hp, wp, rows, columns, patches, patches * channels,
           BLOCK_M=block_m, BLOCK_C=block_c, exact=False)
    return v


def materialized_conv3d(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                        out: Tensor, tile: Optional[WinogradTile] = None) -> Tensor:
    """`winograd.winograd_conv3d_channels_last`'s contract (the same arguments and checks) by the two kernels of
    the module docstring; returns `out`. With `tile.transform_frames` n > 0, the two kernels run per batch element
    and per n output frames, so the input transform's temporary holds n + kt - 1 padded frames of one element
    (frames past the first chunk's are transformed once per chunk that reads them)."""
    shape = checked_shape(padded, weight, bias, residual, out)
    batch, channels, tp, hp, wp = padded.shape
    reason = unsupported_reason(channels, shape[1])
    if reason is not None:
        raise ValueError(f"winograd materialized conv3d: {reason}")
    if out.numel() == 0:
        return out
    tile = tile or WinogradTile()
    if tile.transform_frames <= 0:
        _materialized_chunk(padded, weight, bias, residual, out, tile)
        return out
    taps = weight.shape[1] // channels
    for b in range(batch):
        for f0 in range(0, shape[2], tile.transform_frames):
            f1 = min(f0 + tile.transform_frames, shape[2])
            _materialized_chunk(padded[b: b + 1, :, f0: f1 + taps - 1], weight, bias,
                                None if residual is None else residual[b: b + 1, :, f0: f1], out[b: b + 1, :, f0: f1],
                                tile)
    return out


def _materialized_chunk(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                        out: Tensor, tile: WinogradTile) -> None:
    """The kernels over all of `padded` (channels-last contiguous) into `out` (views of the caller's)."""
    batch, channels, tp, hp, wp = padded.shape
    out_channels, frames = out.shape[1], out.shape[2]
    taps = weight.shape[1] // channels
    v = input_transform(padded)
    rows, columns = (hp - 1) // 2, (wp - 1) // 2
    frame_patches = rows * columns
    v_desc = TensorDescriptor.from_tensor(v.view(POINTS * v.shape[1], channels), [tile.block_m, tile.block_k])
    u_desc = TensorDescriptor.from_tensor(weight.view(POINTS * taps * channels, out_channels),
                                          [tile.block_k, tile.block_n])
    n_blocks = triton.cdiv(out_channels, tile.block_n)
    grid = (triton.cdiv(frame_patches, tile.block_m) * n_blocks, batch * frames)
    res = residual if residual is not None else out
    if tile.split_output:
        out_patches = batch * frames * frame_patches
        sums = torch.empty(POINTS, out_patches, out_channels, dtype=torch.float32, device=padded.device)
        launch(_point_gemm_split_kernel, (*grid, POINTS), v_desc, u_desc, sums, channels, out_channels, taps, frames,
               tp, frame_patches, v.shape[1], out_patches, n_blocks, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
               BLOCK_K=tile.block_k, STAGES=tile.stages, num_warps=tile.warps, exact=False)
        block_m, block_n = 32, min(64, triton.next_power_of_2(out_channels))
        launch(_output_transform_kernel, (triton.cdiv(frame_patches, block_m), batch * frames,
                                          triton.cdiv(out_channels, block_n)),
               sums, bias if bias is not None else out, res, out, out_channels, frames, out.shape[3], out.shape[4],
               columns, frame_patches, out_patches, *out.stride(), *res.stride(), HAS_BIAS=bias is not None,
               HAS_RESIDUAL=residual is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, exact=False)
        return
    launch(_point_gemm_kernel, grid, v_desc, u_desc, bias if bias is not None else out, res, out, channels,
           out_channels, taps, frames, out.shape[3], out.shape[4], tp, columns, frame_patches, v.shape[1], n_blocks,
           *out.stride(), *res.stride(), HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
           BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, STAGES=tile.stages,
           ONE_LOOP=tile.one_loop, num_warps=tile.warps, exact=False)
