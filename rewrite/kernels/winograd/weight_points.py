"""F(4x4, 3x3)'s weight transform in two Triton kernels: the bits of `transforms.transformed_weight_4`.

`transformed_weight_4` scales each of the 36 points by a power of two set by that point's largest magnitude, so
the points are computed twice: `_points_kernel` once to find each program's largest magnitude per point (the
maxima of all programs are reduced by torch, 36 x programs values), then again to scale, round to fp16 and store
them. Nothing else is allocated: on a decode's first chunk (where the kept transforms are refreshed, inside a
CUDA graph) torch's temporaries were 1.5 GB for a 1024 -> 1024 conv whole, and its blocks of channels many small
kernels.

Exactness: exact kernels (no FMA contraction, `rewrite.kernels.launch`), and each point is the torch
expression in its order (``a * first + b * middle + c * last`` along the kernel's height, then its width, in fp32,
`FILTER_TRANSFORM_4`'s entries rounded to fp32 as torch rounds a Python scalar): the same bits on every device
(tested against torch's under the Triton interpreter).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rewrite.kernels.launch import launch
from rewrite.kernels.winograd.transforms import (FILTER_TRANSFORM_4, FP16_TARGET, POINTS_4, checked_outputs_4,
                                                 power_of_two_at_most, transformed_weight_4)
from rewrite.ops.dispatch import INTERPRETING, triton

BLOCK_ROWS = 16  # (tap, input channel) rows of the transformed weight per program
BLOCK_COLUMNS = 32  # output channels per program
#: FILTER_TRANSFORM_4's 18 entries, row-major, as the kernels' constexpr arguments
_G = {f"G{i}{j}": value for i, row in enumerate(FILTER_TRANSFORM_4) for j, value in enumerate(row)}

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _rows(x0, x1, x2, G00: tl.constexpr, G01: tl.constexpr, G02: tl.constexpr, G10: tl.constexpr,
              G11: tl.constexpr, G12: tl.constexpr, G20: tl.constexpr, G21: tl.constexpr, G22: tl.constexpr,
              G30: tl.constexpr, G31: tl.constexpr, G32: tl.constexpr, G40: tl.constexpr, G41: tl.constexpr,
              G42: tl.constexpr, G50: tl.constexpr, G51: tl.constexpr, G52: tl.constexpr):
        """G's six rows applied to three values along one side of the filter."""
        return (G00 * x0 + G01 * x1 + G02 * x2, G10 * x0 + G11 * x1 + G12 * x2, G20 * x0 + G21 * x1 + G22 * x2,
                G30 * x0 + G31 * x1 + G32 * x2, G40 * x0 + G41 * x1 + G42 * x2, G50 * x0 + G51 * x1 + G52 * x2)

    @triton.jit
    def _point_out(value, p: tl.constexpr, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, POINT_STRIDE,
                   SCALED: tl.constexpr):
        """Point p of the program's tile: its largest magnitude stored (first pass), or the value scaled, rounded
        to fp16 and stored (second pass)."""
        if SCALED:
            scaled = value * tl.load(scale_ptr + p)
            tl.store(u_ptr + p * POINT_STRIDE + offsets, scaled.to(tl.float16), mask=mask)
        else:
            tl.store(largest_ptr + program * 36 + p, tl.max(tl.max(tl.where(mask, tl.abs(value), 0.0), 1), 0))

    @triton.jit
    def _point_row(t0, t1, t2, i: tl.constexpr, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, POINT_STRIDE,
                   SCALED: tl.constexpr, G00: tl.constexpr, G01: tl.constexpr, G02: tl.constexpr,
                   G10: tl.constexpr, G11: tl.constexpr, G12: tl.constexpr, G20: tl.constexpr, G21: tl.constexpr,
                   G22: tl.constexpr, G30: tl.constexpr, G31: tl.constexpr, G32: tl.constexpr, G40: tl.constexpr,
                   G41: tl.constexpr, G42: tl.constexpr, G50: tl.constexpr, G51: tl.constexpr, G52: tl.constexpr):
        """Points (i, 0..5): G along the filter's width of row i of the height-transformed filter."""
        p0, p1, p2, p3, p4, p5 = _rows(t0, t1, t2, G00, G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40,
                                       G41, G42, G50, G51, G52)
        _point_out(p0, 6 * i, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, POINT_STRIDE, SCALED)
        _point_out(p1, 6 * i + 1, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, POINT_STRIDE, SCALED)
        _point_out(p2, 6 * i + 2, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, POINT_STRIDE, SCALED)
        _point_out(p3, 6 * i + 3, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, POINT_STRIDE, SCALED)
        _point_out(p4, 6 * i + 4, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, POINT_STRIDE, SCALED)
        _point_out(p5, 6 * i + 5, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, POINT_STRIDE, SCALED)

    @triton.jit
    def _load_column(w_ptr, base, kw, s_h, s_w, mask):
        """Column kw of each filter (its three heights) in fp32."""
        g0 = tl.load(w_ptr + base + kw * s_w, mask=mask, other=0.0).to(tl.float32)
        g1 = tl.load(w_ptr + base + s_h + kw * s_w, mask=mask, other=0.0).to(tl.float32)
        g2 = tl.load(w_ptr + base + 2 * s_h + kw * s_w, mask=mask, other=0.0).to(tl.float32)
        return g0, g1, g2

    @triton.jit
    def _points_kernel(w_ptr, u_ptr, largest_ptr, scale_ptr, C, O, ROWS, s_o, s_c, s_t, s_h, s_w,
                       SCALED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_O: tl.constexpr,
                       G00: tl.constexpr, G01: tl.constexpr, G02: tl.constexpr, G10: tl.constexpr,
                       G11: tl.constexpr, G12: tl.constexpr, G20: tl.constexpr, G21: tl.constexpr, G22: tl.constexpr,
                       G30: tl.constexpr, G31: tl.constexpr, G32: tl.constexpr, G40: tl.constexpr, G41: tl.constexpr,
                       G42: tl.constexpr, G50: tl.constexpr, G51: tl.constexpr, G52: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        program = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        mask = (r < ROWS)[:, None] & (o < O)[None, :]
        tap = (r // C).to(tl.int64)
        c = (r % C).to(tl.int64)
        base = o.to(tl.int64)[None, :] * s_o + (c * s_c + tap * s_t)[:, None]
        offsets = r.to(tl.int64)[:, None] * O + o[None, :]
        point_stride = ROWS.to(tl.int64) * O
        # along the filter's height: t[i][kw] for the six rows i, one column kw at a time
        g0, g1, g2 = _load_column(w_ptr, base, 0, s_h, s_w, mask)
        a0, a1, a2, a3, a4, a5 = _rows(g0, g1, g2, G00, G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40,
                                       G41, G42, G50, G51, G52)
        g0, g1, g2 = _load_column(w_ptr, base, 1, s_h, s_w, mask)
        b0, b1, b2, b3, b4, b5 = _rows(g0, g1, g2, G00, G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40,
                                       G41, G42, G50, G51, G52)
        g0, g1, g2 = _load_column(w_ptr, base, 2, s_h, s_w, mask)
        c0, c1, c2, c3, c4, c5 = _rows(g0, g1, g2, G00, G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40,
                                       G41, G42, G50, G51, G52)
        _point_row(a0, b0, c0, 0, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, point_stride, SCALED, G00,
                   G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40, G41, G42, G50, G51, G52)
        _point_row(a1, b1, c1, 1, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, point_stride, SCALED, G00,
                   G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40, G41, G42, G50, G51, G52)
        _point_row(a2, b2, c2, 2, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, point_stride, SCALED, G00,
                   G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40, G41, G42, G50, G51, G52)
        _point_row(a3, b3, c3, 3, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, point_stride, SCALED, G00,
                   G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40, G41, G42, G50, G51, G52)
        _point_row(a4, b4, c4, 4, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, point_stride, SCALED, G00,
                   G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40, G41, G42, G50, G51, G52)
        _point_row(a5, b5, c5, 5, u_ptr, largest_ptr, scale_ptr, offsets, mask, program, point_stride, SCALED, G00,
                   G01, G02, G10, G11, G12, G20, G21, G22, G30, G31, G32, G40, G41, G42, G50, G51, G52)


def transformed_weight_4_into(weight: Tensor, u_out: Tensor, scales_out: Tensor) -> None:
    """`transforms.transformed_weight_4` of a bf16/fp16/fp32 [O, C, kt, 3, 3] weight (any strides) into `u_out`
    (fp16 [36, kt * C, O], contiguous) and `scales_out` ([36] fp32), by the two passes of the module docstring."""
    out_channels, in_channels, taps = weight.shape[:3]
    rows = taps * in_channels
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(out_channels, BLOCK_COLUMNS))
    largest = torch.empty(grid[0] * grid[1], POINTS_4, dtype=torch.float32, device=weight.device)
    for scaled in (False, True):
        launch(_points_kernel, grid, weight, u_out, largest, scales_out, in_channels, out_channels, rows,
               *weight.stride(), SCALED=scaled, BLOCK_R=BLOCK_ROWS, BLOCK_O=BLOCK_COLUMNS, num_warps=4, **_G)
        if not scaled:
            scales_out.copy_(power_of_two_at_most(FP16_TARGET / largest.amax(dim=0)))


def kernels_serve(weight: Tensor) -> bool:
    """Whether the kernels run `weight`'s transform: Triton importable, a bf16/fp16/fp32 weight with elements, on
    CUDA or, under the Triton interpreter, on the CPU."""
    on_device = weight.is_cuda or (INTERPRETING and weight.device.type == "cpu")
    return triton is not None and on_device and weight.numel() > 0 and weight.dtype in (torch.bfloat16,
                                                                                         torch.float16, torch.float32)


def transformed_weight_4_on_device(weight: Tensor,
                                   out: Optional[tuple[Tensor, Tensor]] = None) -> tuple[Tensor, Tensor]:
    """`transforms.transformed_weight_4(weight, out)` (its checks, its result and `out` semantics), by the kernels
    where they serve (`kernels_serve`), else by torch."""
    if not kernels_serve(weight):
        return transformed_weight_4(weight, out)
    u_out, scales_out = checked_outputs_4(weight, out)
    transformed_weight_4_into(weight, u_out, scales_out)
    return u_out, scales_out
