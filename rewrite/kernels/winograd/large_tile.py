"""Winograd F(4x4, 3x3) conv3d in the split form: an input transform, 36 point GEMMs, an output transform.

Computes what `rewrite.kernels.winograd.winograd.winograd_conv3d_channels_last` computes, for kernels
[O, C, kt, 3, 3], with 36 products per 4x4 block of outputs and (channel, tap) where the direct conv takes 144
(F(2x2, 3x3): 16 per 2x2 block, 2.25x fewer). Three kernels, as `materialized`'s split form:

1. `_input_transform_kernel`: every 6x6 patch (stride 4) of every padded input frame, transformed (``B^T d B``
   with `transforms.INPUT_TRANSFORM_4`, in fp32), times a power-of-two scale, rounded to fp16 and written as
   ``V`` [36, B * Tp * TH * TW, C]: 2.25x the padded input (F(2x2, 3x3): 4x).
2. `materialized._point_gemm_split_kernel` unchanged: one program per point GEMM (TMA loads, one fp32
   accumulator) storing the sums ``M`` [36, output blocks, O] in fp32: 2.25 fp32 values per output (F(2x2): 4).
3. `_output_transform_kernel`: each point's sum times its inverse scale, ``A^T M A`` (`OUTPUT_TRANSFORM_4`), bias
   and residual in fp32, one rounding to the output's dtype.

Exactness: tolerance (level ``channels_last`` only). The operands of the products are fp16 whatever the
activation dtype (bf16's 8 bits lose 16 dB a layer through this transform's larger coefficients, fp16's 11 bits
keep a layer's error near the direct bf16 conv's: `transforms`). fp16's range is kept by powers of two, which
round nothing: each point of the weight is scaled so its largest magnitude is `transforms.FP16_TARGET`
(`transformed_weight_4`), and the input by a scale computed on the device from a bound on the input's magnitude
the caller gives (`input_scale_4`; the fast op's bound: the norm's output is at most ``scale x max |gamma| +
|bias|``). An input past twice its bound would overflow fp16: the bound is the caller's contract.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.kernels.launch import launch
from rewrite.kernels.winograd import materialized
from rewrite.kernels.winograd.common import WinogradTile, checked_geometry
from rewrite.kernels.winograd.transforms import POINTS_4, input_scale_4
from rewrite.ops.dispatch import triton

BLOCK = 4  # outputs per block side
PATCH = 6  # input positions per patch side


def blocks(height: int, width: int) -> tuple[int, int]:
    """(rows, columns) of 4x4 output blocks covering an output plane."""
    return (height + BLOCK - 1) // BLOCK, (width + BLOCK - 1) // BLOCK


class TransformTiles(NamedTuple):
    """The transform kernels' programs: the input transform's patches x channels on its warps, the output
    transform's 4x4 blocks x output channels on its warps. Each holds 36 (input) or about 30 (output) fp32 tiles of
    its block at once: at 2 values a thread per tile ptxas gives them about 130 registers and no spills (sm_90, on
    a CPU), at 4 values 200-254."""

    input_m: int = 8
    input_c: int = 64
    input_warps: int = 8
    output_m: int = 8
    output_n: int = 64
    output_warps: int = 8


if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import round_to as _round
    from rewrite.kernels.winograd.common import _store, output_program
    from rewrite.kernels.winograd.materialized import _pixel

    @triton.jit
    def _bt(d0, d1, d2, d3, d4, d5):
        """`INPUT_TRANSFORM_4` applied to six values along one side of a patch."""
        return (2.0 * d0 + 3.0 * d1 - 4.0 * d2 - 3.0 * d3 + 2.0 * d4,
                2.0 * d1 + 5.0 * d2 + d3 - 2.0 * d4,
                2.0 * d1 + d2 - 5.0 * d3 + 2.0 * d4,
                2.0 * d4 + d3 - 2.0 * d2 - d1,
                2.0 * d3 + d2 - 2.0 * d1 - d4,
                2.0 * d1 + 3.0 * d2 - 4.0 * d3 - 3.0 * d4 + 2.0 * d5)

    @triton.jit
    def _at(m0, m1, m2, m3, m4, m5):
        """`OUTPUT_TRANSFORM_4` applied to six values along one side of the points: four outputs."""
        return (m0 + m1 + m2 + m3 + m4,
                m1 - m2 + 2.0 * m3 - 0.5 * m4,
                m1 + m2 + 4.0 * m3 + 0.25 * m4,
                m1 - m2 + 8.0 * m3 - 0.125 * m4 + m5)

    @triton.jit
    def _patch_row(x_ptr, pixel, rows_ok, u, k, k_ok, WP, HP, C, ty, tx):
        """Row u of each 6x6 patch, transformed along the columns: six [BLOCK_M, BLOCK_C] fp32 tiles (zeros past
        the padded plane's edges)."""
        row_ok = rows_ok & (ty + u < HP)
        base = (pixel + u * WP) * C
        d0 = _pixel(x_ptr, base, row_ok, 0, k, k_ok, WP, C, tx)
        d1 = _pixel(x_ptr, base, row_ok, 1, k, k_ok, WP, C, tx)
        d2 = _pixel(x_ptr, base, row_ok, 2, k, k_ok, WP, C, tx)
        d3 = _pixel(x_ptr, base, row_ok, 3, k, k_ok, WP, C, tx)
        d4 = _pixel(x_ptr, base, row_ok, 4, k, k_ok, WP, C, tx)
        d5 = _pixel(x_ptr, base, row_ok, 5, k, k_ok, WP, C, tx)
        return _bt(d0, d1, d2, d3, d4, d5)

    @triton.jit
    def _store_column(v_ptr, e0, e1, e2, e3, e4, e5, s: tl.constexpr, scale, point_stride, offsets, mask):
        """Points (0..5, s): `_bt` along the patch rows of column s's six values, scaled, rounded to fp16."""
        p0, p1, p2, p3, p4, p5 = _bt(e0, e1, e2, e3, e4, e5)
        dtype = v_ptr.dtype.element_ty
        tl.store(v_ptr + s * point_stride + offsets, _round(p0 * scale, dtype), mask=mask)
        tl.store(v_ptr + (6 + s) * point_stride + offsets, _round(p1 * scale, dtype), mask=mask)
        tl.store(v_ptr + (12 + s) * point_stride + offsets, _round(p2 * scale, dtype), mask=mask)
        tl.store(v_ptr + (18 + s) * point_stride + offsets, _round(p3 * scale, dtype), mask=mask)
        tl.store(v_ptr + (24 + s) * point_stride + offsets, _round(p4 * scale, dtype), mask=mask)
        tl.store(v_ptr + (30 + s) * point_stride + offsets, _round(p5 * scale, dtype), mask=mask)

    @triton.jit
    def _input_transform_kernel(x_ptr, v_ptr, scale_ptr, C, HP, WP, FRAME_ROWS, TH, TW, PATCHES, POINT_STRIDE,
                                BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        k = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        k_ok = k < C
        rows_ok = m < PATCHES
        m = tl.where(rows_ok, m, 0).to(tl.int64)
        frame = m // (TW * TH)  # b * Tp + t of the padded input
        ty = 4 * ((m // TW) % TH)
        tx = 4 * (m % TW)
        pixel = (frame * FRAME_ROWS + ty) * WP + tx  # FRAME_ROWS: HP, or more for a band of a taller plane
        a0, a1, a2, a3, a4, a5 = _patch_row(x_ptr, pixel, rows_ok, 0, k, k_ok, WP, HP, C, ty, tx)
        b0, b1, b2, b3, b4, b5 = _patch_row(x_ptr, pixel, rows_ok, 1, k, k_ok, WP, HP, C, ty, tx)
        c0, c1, c2, c3, c4, c5 = _patch_row(x_ptr, pixel, rows_ok, 2, k, k_ok, WP, HP, C, ty, tx)
        d0, d1, d2, d3, d4, d5 = _patch_row(x_ptr, pixel, rows_ok, 3, k, k_ok, WP, HP, C, ty, tx)
        e0, e1, e2, e3, e4, e5 = _patch_row(x_ptr, pixel, rows_ok, 4, k, k_ok, WP, HP, C, ty, tx)
        f0, f1, f2, f3, f4, f5 = _patch_row(x_ptr, pixel, rows_ok, 5, k, k_ok, WP, HP, C, ty, tx)
        scale = tl.load(scale_ptr)
        offsets = (m * C)[:, None] + k[None, :]
        mask = rows_ok[:, None] & k_ok[None, :]
        point_stride = POINT_STRIDE.to(tl.int64)
        _store_column(v_ptr, a0, b0, c0, d0, e0, f0, 0, scale, point_stride, offsets, mask)
        _store_column(v_ptr, a1, b1, c1, d1, e1, f1, 1, scale, point_stride, offsets, mask)
        _store_column(v_ptr, a2, b2, c2, d2, e2, f2, 2, scale, point_stride, offsets, mask)
        _store_column(v_ptr, a3, b3, c3, d3, e3, f3, 3, scale, point_stride, offsets, mask)
        _store_column(v_ptr, a4, b4, c4, d4, e4, f4, 4, scale, point_stride, offsets, mask)
        _store_column(v_ptr, a5, b5, c5, d5, e5, f5, 5, scale, point_stride, offsets, mask)

    @triton.jit
    def _sum_row(m_ptr, inv_ptr, i: tl.constexpr, rows, n, mask, O, OUT_PATCHES):
        """Row i of the points' fp32 sums (each times its inverse scale), transformed along the columns."""
        base = rows[:, None] * O + n[None, :]
        stride = OUT_PATCHES * O
        m0 = tl.load(m_ptr + (6 * i) * stride + base, mask=mask, other=0.0) * tl.load(inv_ptr + 6 * i)
        m1 = tl.load(m_ptr + (6 * i + 1) * stride + base, mask=mask, other=0.0) * tl.load(inv_ptr + 6 * i + 1)
        m2 = tl.load(m_ptr + (6 * i + 2) * stride + base, mask=mask, other=0.0) * tl.load(inv_ptr + 6 * i + 2)
        m3 = tl.load(m_ptr + (6 * i + 3) * stride + base, mask=mask, other=0.0) * tl.load(inv_ptr + 6 * i + 3)
        m4 = tl.load(m_ptr + (6 * i + 4) * stride + base, mask=mask, other=0.0) * tl.load(inv_ptr + 6 * i + 4)
        m5 = tl.load(m_ptr + (6 * i + 5) * stride + base, mask=mask, other=0.0) * tl.load(inv_ptr + 6 * i + 5)
        return _at(m0, m1, m2, m3, m4, m5)

    @triton.jit
    def _store_column_of_outputs(y0, y1, y2, y3, j: tl.constexpr, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok,
                                 rows_ok, H, W, so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w,
                                 HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
        """Outputs (0..3, j) of each 4x4 block at (h0, w0), by `_store`."""
        _store(y0, out_ptr, res_ptr, bias_ptr, b, t, h0, w0 + j, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h, so_w,
               sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        _store(y1, out_ptr, res_ptr, bias_ptr, b, t, h0 + 1, w0 + j, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h,
               so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        _store(y2, out_ptr, res_ptr, bias_ptr, b, t, h0 + 2, w0 + j, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h,
               so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        _store(y3, out_ptr, res_ptr, bias_ptr, b, t, h0 + 3, w0 + j, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h,
               so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)

    @triton.jit
    def _output_transform_kernel(m_ptr, inv_ptr, bias_ptr, res_ptr, out_ptr, O, T, H, W, TW, FRAME_PATCHES,
                                 OUT_PATCHES, so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w,
                                 HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                                 BLOCK_N: tl.constexpr):
        """``A^T M A`` of `BLOCK_M` 4x4 blocks of one output frame by `BLOCK_N` channels, bias, residual, one
        rounding."""
        frame, m, n, rows_ok, n_ok, mask, rows = output_program(FRAME_PATCHES, O, BLOCK_M, BLOCK_N)
        r00, r01, r02, r03 = _sum_row(m_ptr, inv_ptr, 0, rows, n, mask, O, OUT_PATCHES)
        r10, r11, r12, r13 = _sum_row(m_ptr, inv_ptr, 1, rows, n, mask, O, OUT_PATCHES)
        r20, r21, r22, r23 = _sum_row(m_ptr, inv_ptr, 2, rows, n, mask, O, OUT_PATCHES)
        r30, r31, r32, r33 = _sum_row(m_ptr, inv_ptr, 3, rows, n, mask, O, OUT_PATCHES)
        r40, r41, r42, r43 = _sum_row(m_ptr, inv_ptr, 4, rows, n, mask, O, OUT_PATCHES)
        r50, r51, r52, r53 = _sum_row(m_ptr, inv_ptr, 5, rows, n, mask, O, OUT_PATCHES)
        b = (frame // T).to(tl.int64)
        t = (frame % T).to(tl.int64)
        h0 = 4 * (m // TW)
        w0 = 4 * (m % TW)
        y0, y1, y2, y3 = _at(r00, r10, r20, r30, r40, r50)
        _store_column_of_outputs(y0, y1, y2, y3, 0, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok, rows_ok, H, W,
                                 so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        y0, y1, y2, y3 = _at(r01, r11, r21, r31, r41, r51)
        _store_column_of_outputs(y0, y1, y2, y3, 1, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok, rows_ok, H, W,
                                 so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        y0, y1, y2, y3 = _at(r02, r12, r22, r32, r42, r52)
        _store_column_of_outputs(y0, y1, y2, y3, 2, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok, rows_ok, H, W,
                                 so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        y0, y1, y2, y3 = _at(r03, r13, r23, r33, r43, r53)
        _store_column_of_outputs(y0, y1, y2, y3, 3, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok, rows_ok, H, W,
                                 so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)


def input_transform(padded: Tensor, scale: Tensor, tiles: TransformTiles = TransformTiles()) -> Tensor:
    """``V`` of the module docstring for a channels-last padded input: [36, B * Tp * TH * TW, C] fp16, each value
    times `scale` (a device scalar, `transforms.input_scale_4`). `padded` may be a band of rows of a channels-last
    contiguous tensor (a view: its frames further apart than its rows)."""
    batch, channels, tp, hp, wp = padded.shape
    row = wp * channels
    if padded.stride(1) != 1 or padded.stride(4) != channels or padded.stride(3) != row \
            or padded.stride(2) % row or padded.stride(0) != tp * padded.stride(2):
        raise ValueError(f"winograd F(4x4, 3x3) input transform: expected a channels-last tensor or a band of its "
                         f"rows, got {tuple(padded.shape)} strides {padded.stride()}")
    rows, columns = blocks(hp - 2, wp - 2)
    patches = batch * tp * rows * columns
    v = torch.empty(POINTS_4, patches, channels, dtype=torch.float16, device=padded.device)
    grid = (triton.cdiv(patches, tiles.input_m), triton.cdiv(channels, tiles.input_c))
    launch(_input_transform_kernel, grid, padded, v, scale, channels, hp, wp, padded.stride(2) // row, rows, columns,
           patches, patches * channels, BLOCK_M=tiles.input_m, BLOCK_C=tiles.input_c, num_warps=tiles.input_warps,
           exact=False)
    return v


def output_transform(sums: Tensor, inverse_scales: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                     out: Tensor, tiles: TransformTiles = TransformTiles()) -> Tensor:
    """`out` (+ bias, + residual) from the points' fp32 sums [36, B * T * TH * TW, O] times `inverse_scales` [36]
    (fp32): the module docstring's third kernel; returns `out`."""
    batch, out_channels, frames, height, width = out.shape
    rows, columns = blocks(height, width)
    frame_patches = rows * columns
    res = residual if residual is not None else out
    launch(_output_transform_kernel, (triton.cdiv(frame_patches, tiles.output_m), batch * frames,
                                      triton.cdiv(out_channels, tiles.output_n)),
           sums, inverse_scales, bias if bias is not None else out, res, out, out_channels, frames, height, width,
           columns, frame_patches, sums.shape[1], *out.stride(), *res.stride(), HAS_BIAS=bias is not None,
           HAS_RESIDUAL=residual is not None, BLOCK_M=tiles.output_m, BLOCK_N=tiles.output_n,
           num_warps=tiles.output_warps, exact=False)
    return out


def large_tile_conv3d(padded: Tensor, weight: Tensor, point_scales: Tensor, bound: Tensor, bias: Optional[Tensor],
                      residual: Optional[Tensor], out: Tensor, tile: WinogradTile,
                      tiles: TransformTiles = TransformTiles()) -> Tensor:
    """``conv3d(padded, weight, bias) (+ residual)`` into `out` by the three kernels of the module docstring, over
    bands of block rows whose temporaries fit `TEMPORARY_BYTES` (each band's patches are its own: no work is repeated);
    returns `out`. `weight` and `point_scales` are `transforms.transformed_weight_4`'s ([36, kt * C, O] fp16 and
    [36] fp32), `bound` a device scalar at least the padded input's largest magnitude (module docstring); `padded`,
    `out`, `bias` and `residual` as `winograd_conv3d_channels_last` states; `tile`'s blocks are the point GEMM's,
    `tiles` the transforms'."""
    if weight.dim() != 3 or weight.shape[0] != POINTS_4 or weight.dtype != torch.float16:
        raise ValueError(f"winograd F(4x4, 3x3): weight must be transformed_weight_4's fp16 [{POINTS_4}, kt * C, O], "
                         f"got {tuple(weight.shape)} {weight.dtype}")
    if tuple(point_scales.shape) != (POINTS_4,):
        raise ValueError(f"winograd F(4x4, 3x3): point_scales must be [{POINTS_4}], got {tuple(point_scales.shape)}")
    channels = padded.shape[1] if padded.dim() == 5 else None
    if not channels or weight.shape[1] % channels or not weight.is_contiguous():
        raise ValueError(f"winograd F(4x4, 3x3): weight [{POINTS_4}, kt * C, O] (contiguous) for an input "
                         f"[B, C, T, H, W], got {tuple(weight.shape)} and {tuple(padded.shape)}")
    shape = checked_geometry(padded, weight.shape[1] // channels, weight.shape[2], bias, residual, out)
    out_channels, frames = shape[1], shape[2]
    reason = materialized.unsupported_reason(channels, out_channels)
    if reason is not None:
        raise ValueError(f"winograd F(4x4, 3x3): {reason}")
    if out.numel() == 0:
        return out
    scale = input_scale_4(bound)
    inverse_scales = (1.0 / (scale * point_scales.float())).contiguous()
    rows = blocks(shape[3], shape[4])[0]
    band = band_rows(padded.shape, out_channels, frames)
    for r0 in range(0, rows, band):
        r1 = min(rows, r0 + band)
        _conv_band(padded[:, :, :, BLOCK * r0: BLOCK * r1 + 2], weight, scale, inverse_scales, bias,
                   None if residual is None else residual[:, :, :, BLOCK * r0: BLOCK * r1],
                   out[:, :, :, BLOCK * r0: BLOCK * r1], tile, tiles)
    return out


#: the most bytes the transformed input and the fp32 sums of one band of rows may take together (the graphs' pool
#: holds them at the largest conv's size): Wan 2.2's 256-channel layer at 720p would take 3.7 GB at once, and the
#: decode's peak rose past `off`'s with it (docs/tuning.md 1.25)
TEMPORARY_BYTES = 512 * 1024 * 1024


def band_rows(padded_shape, out_channels: int, frames: int) -> int:
    """Block rows per band: as many as keep a band's temporaries within `TEMPORARY_BYTES` (at least one)."""
    batch, channels, tp, hp, wp = padded_shape
    rows, columns = blocks(hp - 2, wp - 2)
    per_row = POINTS_4 * batch * columns * (tp * channels * 2 + frames * out_channels * 4)
    return max(1, min(rows, TEMPORARY_BYTES // per_row))


def _conv_band(padded: Tensor, weight: Tensor, scale: Tensor, inverse_scales: Tensor, bias: Optional[Tensor],
               residual: Optional[Tensor], out: Tensor, tile: WinogradTile, tiles: TransformTiles) -> None:
    """The three kernels over one band of rows (views of the caller's checked tensors)."""
    batch, channels, tp, hp, wp = padded.shape
    out_channels, frames = out.shape[1], out.shape[2]
    taps = weight.shape[1] // channels
    v = input_transform(padded, scale, tiles)
    rows, columns = blocks(hp - 2, wp - 2)
    frame_patches = rows * columns
    out_patches = batch * frames * frame_patches
    v_desc = materialized.TensorDescriptor.from_tensor(v.view(POINTS_4 * v.shape[1], channels),
                                                       [tile.block_m, tile.block_k])
    u_desc = materialized.TensorDescriptor.from_tensor(weight.view(POINTS_4 * taps * channels, out_channels),
                                                       [tile.block_k, tile.block_n])
    n_blocks = triton.cdiv(out_channels, tile.block_n)
    sums = torch.empty(POINTS_4, out_patches, out_channels, dtype=torch.float32, device=padded.device)
    launch(materialized._point_gemm_split_kernel,
           (triton.cdiv(frame_patches, tile.block_m) * n_blocks, batch * frames, POINTS_4), v_desc, u_desc, sums,
           channels, out_channels, taps, frames, tp, frame_patches, v.shape[1], out_patches, n_blocks,
           BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, STAGES=tile.stages,
           num_warps=tile.warps, exact=False)
    del v
    output_transform(sums, inverse_scales, bias, residual, out, tiles)
