"""The fused Winograd form: one Triton kernel whose operand loads compute the input transform.

A program computes ``BLOCK_M`` 2x2 output blocks (consecutive along a row of blocks of one frame) by ``BLOCK_N``
output channels. Point by point (a runtime loop over the 16, so that nothing of one point is hoisted into
registers for all of them), it runs that point's GEMM over every temporal tap and block of input channels: the
left operand is the point's input transform of ``BLOCK_M`` patches, combined from four loads of
``[BLOCK_M, BLOCK_K]`` pixels of the padded input (the point's two rows by two columns of each 4x4 patch), the
right operand the point's ``[BLOCK_K, BLOCK_N]`` slice of the transformed weight. The point's fp32 sum is then
added into the four outputs of the block with the output transform's coefficients (0 or +-1, multiplied: 4
products per output element a point against the GEMM's 2 x taps x C), so only five ``[BLOCK_M, BLOCK_N]``
accumulators live at a time rather than sixteen. The input transform is never written to memory. Blocks past a
plane's odd last row or column read zeros past the padded input's edge; those outputs are masked at the store
(the transform sends a patch's last row and column only into the block's second row and column of outputs).
"""

from __future__ import annotations

from torch import Tensor
from typing import Optional

from rewrite.kernels.launch import launch
from rewrite.kernels.winograd.common import WinogradTile, checked_shape
from rewrite.ops.dispatch import triton

if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import dot as _dot
    from rewrite.kernels.aten_math import round_to as _round
    from rewrite.kernels.winograd.common import add_point, patch_origin, store_block

    @triton.jit
    def _pixels(x_ptr, pixel, rows_ok, u, v, k, k_ok, WP, HP, C, ty_row, tx_col):
        """fp32 [BLOCK_M, BLOCK_K] of patch position (u, v) of each block: zero past the padded plane's edge."""
        inside = rows_ok & (ty_row + u < HP) & (tx_col + v < WP)
        offsets = (pixel + u * WP + v) * C
        return tl.load(x_ptr + offsets[:, None] + k[None, :], mask=inside[:, None] & k_ok[None, :],
                       other=0.0).to(tl.float32)

    @triton.jit
    def _input_point(x_ptr, pixel, rows_ok, r, s, k, k_ok, WP, HP, C, ty_row, tx_col):
        """Point (r, s) of B^T d B for each block's 4x4 patch d, from the four pixels it combines: B^T's row r is
        (+1 at r_first, sign at r_second) with r_first 0, 1, 1, 1 and r_second 2, 2, 2, 3 for r = 0..3, and
        d0 - d2, d1 + d2, d2 - d1, d1 - d3 as signed pairs (the first entry negated for r = 2)."""
        r_first = (r + 2) // 3
        r_second = 2 + r // 3
        r_sign_first = tl.where(r == 2, -1.0, 1.0)
        r_sign_second = tl.where((r == 0) | (r == 3), -1.0, 1.0)
        s_first = (s + 2) // 3
        s_second = 2 + s // 3
        s_sign_first = tl.where(s == 2, -1.0, 1.0)
        s_sign_second = tl.where((s == 0) | (s == 3), -1.0, 1.0)
        rows = (r_sign_first * s_sign_first * _pixels(x_ptr, pixel, rows_ok, r_first, s_first, k, k_ok, WP, HP, C,
                                                      ty_row, tx_col)
                + r_sign_first * s_sign_second * _pixels(x_ptr, pixel, rows_ok, r_first, s_second, k, k_ok, WP, HP, C,
                                                         ty_row, tx_col))
        return rows + (r_sign_second * s_sign_first * _pixels(x_ptr, pixel, rows_ok, r_second, s_first, k, k_ok, WP,
                                                              HP, C, ty_row, tx_col)
                       + r_sign_second * s_sign_second * _pixels(x_ptr, pixel, rows_ok, r_second, s_second, k, k_ok,
                                                                 WP, HP, C, ty_row, tx_col))

    @triton.jit
    def _winograd_kernel(x_ptr, u_ptr, bias_ptr, res_ptr, out_ptr, C, O, KT, T, H, W, TP, HP, WP, TH, TW, BLOCKS,
                         so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w,
                         HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < O
        rows_ok, frame, ty_row, tx_col = patch_origin(m, BLOCKS, TH, TW)  # frame: b * T + t of the output
        b = frame // T
        t = frame % T
        k_base = tl.arange(0, BLOCK_K)
        dtype = x_ptr.dtype.element_ty
        y00 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        y01 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        y10 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        y11 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for point in range(16):  # a runtime loop: nothing of one point is hoisted into registers for all 16
            r = point // 4
            s = point % 4
            acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
            for tap in range(KT):
                pixel = ((b * TP + t + tap) * HP + ty_row) * WP + tx_col  # the patch's first pixel
                for c0 in range(0, C, BLOCK_K):
                    k = c0 + k_base
                    k_ok = k < C
                    a = _input_point(x_ptr, pixel, rows_ok, r, s, k, k_ok, WP, HP, C, ty_row, tx_col)
                    k_row = (point * KT + tap) * C + k  # rows of the transformed weight [16 * KT * C, O]
                    wt = tl.load(u_ptr + k_row.to(tl.int64)[:, None] * O + n[None, :],
                                 mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                    acc = _dot(_round(a, dtype), wt, acc)
            # the output transform, one point at a time
            y00, y01, y10, y11 = add_point(acc, point, y00, y01, y10, y11)
        h0 = ty_row.to(tl.int32)
        w0 = tx_col.to(tl.int32)
        store_block(y00, y01, y10, y11, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok, rows_ok, H, W, so_b,
                    so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)


def fused_conv3d(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                out: Tensor, tile: WinogradTile) -> Tensor:
    """`winograd.winograd_conv3d_channels_last` by the fused kernel; returns `out`."""
    shape = checked_shape(padded, weight, bias, residual, out)
    batch, channels, tp, hp, wp = padded.shape
    out_channels, taps = shape[1], weight.shape[1] // channels
    if out.numel() == 0:
        return out
    _, _, frames, height, width = shape
    rows, columns = (height + 1) // 2, (width + 1) // 2
    blocks = batch * frames * rows * columns
    grid = (triton.cdiv(blocks, tile.block_m), triton.cdiv(out_channels, tile.block_n))
    res = residual if residual is not None else out
    launch(_winograd_kernel, grid, padded, weight, bias if bias is not None else out, res, out, channels,
           out_channels, taps, frames, height, width, tp, hp, wp, rows, columns, blocks, *out.stride(), *res.stride(),
           HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, BLOCK_M=tile.block_m,
           BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, num_warps=tile.warps, num_stages=tile.stages, exact=False)
    return out
