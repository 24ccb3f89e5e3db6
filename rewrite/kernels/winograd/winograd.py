"""A 3x3 (x kt) conv3d over a pre-padded channels-last input by Winograd F(2x2, 3x3), as one Triton kernel.

Computes what `rewrite.kernels.conv3d.conv3d.conv3d_channels_last` computes, for kernels [O, C, kt, 3, 3]::

    out[b, o, t, h, w] = sum_{i, j, k, c} weight[o, c, i, j, k] * padded[b, c, t + i, h + j, w + k]
                         (+ bias[o]) (+ residual[b, o, t, h, w])

with 16 products per 2x2 block of outputs and (channel, tap) where the direct conv takes 36 (`transforms`).
Exactness: tolerance (level ``channels_last`` only). The input transform runs in fp32 on the loaded pixels and
its result is rounded to the activation dtype, the weight comes transformed in that dtype (`transformed_weight`),
the 16 GEMMs accumulate in fp32 and the output transform, bias and residual are applied in fp32 before one
rounding: the arithmetic issue 40 measured against the `channels_last` contract. fp32 activations are computed
at IEEE precision under the interpreter only (CPU tests); on a GPU they are refused (`unsupported_reason`: the
fp32 decoders keep their exact ops).

Kernel: a program computes ``BLOCK_M`` 2x2 output blocks (consecutive along a row of blocks of one frame) by
``BLOCK_N`` output channels. Point by point (a runtime loop over the 16), it runs that point's GEMM over every temporal tap
and block of input channels: the left operand is the point's input transform of ``BLOCK_M`` patches,
combined from four loads of ``[BLOCK_M, BLOCK_K]`` pixels of the padded input (the point's two rows by two
columns of each 4x4 patch), the right operand the point's ``[BLOCK_K, BLOCK_N]`` slice of the transformed
weight. The point's fp32 sum is then added at once into the four outputs of the block with the output
transform's coefficients (0 or +-1; multiplied, 4 products per output element a point against the GEMM's
2 x taps x C), so only five ``[BLOCK_M, BLOCK_N]`` accumulators live at a time rather
than sixteen. The input transform is never written to memory (peak memory: the output's). Blocks past a
plane's odd last row or column read zeros past the padded input's edge; those outputs are masked at the store
(the transform sends a patch's last row and column only into the block's second row and column of outputs).

What is not here yet: TMA loads, a pipelined K loop, the epilogues of the direct conv beyond bias and residual,
and a measured choice (`chosen`, whose table is empty until the GPU sweep `python -m rewrite.tools.sweep_winograd`
fills it per card): no op routes to this kernel yet.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.kernels.launch import launch
from rewrite.kernels.winograd.transforms import POINTS, transformed_weight
from rewrite.ops.dispatch import INTERPRETING, triton

GPU_DTYPES = (torch.bfloat16, torch.float16)


class WinogradTile(NamedTuple):
    """A launch configuration: `block_m` 2x2 output blocks by `block_n` output channels per program, `block_k`
    input channels per GEMM step, `warps`, pipeline `stages`."""

    block_m: int = 32
    block_n: int = 64
    block_k: int = 32
    warps: int = 4
    stages: int = 2


#: (card, in channels, out channels, dtype) -> tile, for the convs this kernel measured faster than both the
#: Triton direct conv and cuDNN on that card (the sweep fills it; empty: never chosen)
_MEASURED_FASTER: dict[tuple[str, int, int, torch.dtype], WinogradTile] = {}


def chosen(in_channels: int, out_channels: int, dtype: torch.dtype, device: torch.device) -> Optional[WinogradTile]:
    """The tile with which this kernel serves the conv on `device`'s card, or None (the direct conv or cuDNN)."""
    if device.type != "cuda":
        return None
    return _MEASURED_FASTER.get((torch.cuda.get_device_name(device), in_channels, out_channels, dtype))


def unsupported_reason(in_shape, weight_shape, dtype: torch.dtype) -> Optional[str]:
    """None when the kernel serves a padded input of `in_shape` ([B, C, Tp, Hp, Wp]) and a conv weight of
    `weight_shape` ([O, C, kt, 3, 3]) in `dtype`, else why not."""
    if triton is None:
        return "triton is not importable"
    if len(in_shape) != 5 or len(weight_shape) != 5 or in_shape[1] != weight_shape[1]:
        return f"expected [B, C, T, H, W] and [O, C, kt, kh, kw], got {tuple(in_shape)} and {tuple(weight_shape)}"
    if tuple(weight_shape[3:]) != (3, 3):
        return f"a {tuple(weight_shape[2:])} kernel (Winograd F(2x2, 3x3) serves 3x3 planes)"
    if dtype not in GPU_DTYPES and not (INTERPRETING and dtype == torch.float32):
        return f"dtype {dtype} (served: {GPU_DTYPES}; fp32 only under the Triton interpreter)"
    if any(s < k for s, k in zip(in_shape[2:], weight_shape[2:])):
        return f"input {tuple(in_shape[2:])} is smaller than the kernel {tuple(weight_shape[2:])}"
    return None


if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import dot as _dot
    from rewrite.kernels.aten_math import round_to as _round

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
    def _store(y, out_ptr, res_ptr, bias_ptr, b, t, h, w, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h, so_w,
               sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
        """One output of each block (row h, column w) plus bias and residual in fp32, rounded once, stored."""
        inside = rows_ok & (h < H) & (w < W)
        mask = inside[:, None] & n_ok[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_RESIDUAL:
            r_off = b * sr_b + t * sr_t + h.to(tl.int64) * sr_h + w.to(tl.int64) * sr_w
            y += tl.load(res_ptr + r_off[:, None] + n[None, :].to(tl.int64) * sr_c, mask=mask, other=0.0).to(tl.float32)
        o_off = b * so_b + t * so_t + h.to(tl.int64) * so_h + w.to(tl.int64) * so_w
        tl.store(out_ptr + o_off[:, None] + n[None, :].to(tl.int64) * so_c, _round(y, out_ptr.dtype.element_ty),
                 mask=mask)

    @triton.jit
    def _winograd_kernel(x_ptr, u_ptr, bias_ptr, res_ptr, out_ptr, C, O, KT, T, H, W, TP, HP, WP, TH, TW, BLOCKS,
                         so_b, so_c, so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w,
                         HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_ok = m < BLOCKS
        n_ok = n < O
        m = tl.where(rows_ok, m, 0).to(tl.int64)
        tx = m % TW
        ty = (m // TW) % TH
        frame = m // (TW * TH)  # b * T + t
        b = frame // T
        t = frame % T
        ty_row = 2 * ty  # the patch's first row and column in the padded plane
        tx_col = 2 * tx
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
            # the output transform A^T M A, one point at a time: A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]
            r_first = tl.where(r < 3, 1.0, 0.0)
            r_second = tl.where(r == 0, 0.0, tl.where(r == 1, 1.0, -1.0))
            s_first = tl.where(s < 3, 1.0, 0.0)
            s_second = tl.where(s == 0, 0.0, tl.where(s == 1, 1.0, -1.0))
            y00 += (r_first * s_first) * acc
            y01 += (r_first * s_second) * acc
            y10 += (r_second * s_first) * acc
            y11 += (r_second * s_second) * acc
        h0 = ty_row.to(tl.int32)
        w0 = tx_col.to(tl.int32)
        _store(y00, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h, so_w,
               sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        _store(y01, out_ptr, res_ptr, bias_ptr, b, t, h0, w0 + 1, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h,
               so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        _store(y10, out_ptr, res_ptr, bias_ptr, b, t, h0 + 1, w0, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h,
               so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        _store(y11, out_ptr, res_ptr, bias_ptr, b, t, h0 + 1, w0 + 1, n, n_ok, rows_ok, H, W, so_b, so_c, so_t,
               so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)


def winograd_conv3d_channels_last(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                                  out: Tensor, tile: Optional[WinogradTile] = None) -> Tensor:
    """``conv3d(padded, weight, bias) (+ residual)`` into `out` ([B, O, T, H, W] of the unpadded conv, any strides,
    the activation dtype) by the kernel of the module docstring; returns `out`. `padded` must be channels-last
    (NDHWC) contiguous; `weight` is `transformed_weight` of the [O, C, kt, 3, 3] conv weight ([16, kt*C, O]), in
    the activation dtype."""
    if padded.dim() != 5 or not padded.is_contiguous(memory_format=torch.channels_last_3d):
        raise ValueError(f"winograd_conv3d_channels_last: padded input must be [B, C, T, H, W] in channels-last "
                         f"(NDHWC) contiguous memory, got {tuple(padded.shape)} strides {padded.stride()}")
    batch, channels, tp, hp, wp = padded.shape
    if weight.dim() != 3 or weight.shape[0] != POINTS or weight.shape[1] % channels or not weight.is_contiguous():
        raise ValueError(f"winograd_conv3d_channels_last: weight must be transformed_weight's contiguous "
                         f"[{POINTS}, kt * {channels}, O], got {tuple(weight.shape)}")
    taps, out_channels = weight.shape[1] // channels, weight.shape[2]
    reason = unsupported_reason(padded.shape, (out_channels, channels, taps, 3, 3), padded.dtype)
    if reason is not None:
        raise ValueError(f"winograd_conv3d_channels_last: {reason}")
    if weight.dtype != padded.dtype:
        raise ValueError(f"winograd_conv3d_channels_last: weight dtype {weight.dtype}, input {padded.dtype}")
    shape = (batch, out_channels, tp - taps + 1, hp - 2, wp - 2)
    if tuple(out.shape) != shape or out.dtype != padded.dtype:
        raise ValueError(f"winograd_conv3d_channels_last: out must be {shape} {padded.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise ValueError(f"winograd_conv3d_channels_last: bias must be [{out_channels}], got {tuple(bias.shape)}")
    if residual is not None and tuple(residual.shape) != shape:
        raise ValueError(f"winograd_conv3d_channels_last: residual must be {shape}, got {tuple(residual.shape)}")
    if out.numel() == 0:
        return out
    tile = tile or WinogradTile()
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


def winograd_conv3d(padded: Tensor, weight: Tensor, bias: Optional[Tensor] = None, residual: Optional[Tensor] = None,
                    tile: Optional[WinogradTile] = None) -> Tensor:
    """`winograd_conv3d_channels_last` from a plain [O, C, kt, 3, 3] weight into a new channels-last output: the
    convenience form for tests and sweeps (an op transforms its weight once and keeps it)."""
    padded = padded.contiguous(memory_format=torch.channels_last_3d)
    batch, _, tp, hp, wp = padded.shape
    shape = (batch, weight.shape[0], tp - weight.shape[2] + 1, hp - 2, wp - 2)
    out = torch.empty(shape, dtype=padded.dtype, device=padded.device, memory_format=torch.channels_last_3d)
    return winograd_conv3d_channels_last(padded, transformed_weight(weight, padded.dtype), bias, residual, out, tile)
