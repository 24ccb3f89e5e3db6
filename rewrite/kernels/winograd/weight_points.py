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

if triton is not None:
    import triton.language as tl

    #: FILTER_TRANSFORM_4's entries as the kernels' compile-time constants (row i, column j: _Gij)
    ((_G00, _G01, _G02), (_G10, _G11, _G12), (_G20, _G21, _G22), (_G30, _G31, _G32), (_G40, _G41, _G42),
     (_G50, _G51, _G52)) = [[tl.constexpr(value) for value in row] for row in FILTER_TRANSFORM_4]

    @triton.jit
    def _filter_row(x0, x1, x2, I: tl.constexpr):
        """Row I of G applied to three values along one side of the filter, in the torch expression's order (each
        product's operands swapped: a product is the same either way; the constant on the right keeps it a tensor
        product under the interpreter)."""
        if I == 0:
            return x0 * _G00 + x1 * _G01 + x2 * _G02
        elif I == 1:
            return x0 * _G10 + x1 * _G11 + x2 * _G12
        elif I == 2:
            return x0 * _G20 + x1 * _G21 + x2 * _G22
        elif I == 3:
            return x0 * _G30 + x1 * _G31 + x2 * _G32
        elif I == 4:
            return x0 * _G40 + x1 * _G41 + x2 * _G42
        else:
            return x0 * _G50 + x1 * _G51 + x2 * _G52

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
    def _load_column(w_ptr, base, kw, s_h, s_w, mask):
        """Column kw of each filter (its three heights) in fp32."""
        g0 = tl.load(w_ptr + base + kw * s_w, mask=mask, other=0.0).to(tl.float32)
        g1 = tl.load(w_ptr + base + s_h + kw * s_w, mask=mask, other=0.0).to(tl.float32)
        g2 = tl.load(w_ptr + base + 2 * s_h + kw * s_w, mask=mask, other=0.0).to(tl.float32)
        return g0, g1, g2

    @triton.jit
    def _points_kernel(w_ptr, u_ptr, largest_ptr, scale_ptr, C, O, ROWS, s_o, s_c, s_t, s_h, s_w,
                       SCALED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_O: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        program = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        mask = (r < ROWS)[:, None] & (o < O)[None, :]
        tap = (r // C).to(tl.int64)
        c = (r % C).to(tl.int64)
        base = o.to(tl.int64)[None, :] * s_o + (c * s_c + tap * s_t)[:, None]
        offsets = r.to(tl.int64)[:, None] * O + o[None, :]
        point_stride = ROWS.to(tl.int64) * O
        h00, h10, h20 = _load_column(w_ptr, base, 0, s_h, s_w, mask)  # h<height><width>
        h01, h11, h21 = _load_column(w_ptr, base, 1, s_h, s_w, mask)
        h02, h12, h22 = _load_column(w_ptr, base, 2, s_h, s_w, mask)
        for i in tl.static_range(6):  # row i along the filter's height, then point (i, j) along its width
            t0 = _filter_row(h00, h10, h20, i)
            t1 = _filter_row(h01, h11, h21, i)
            t2 = _filter_row(h02, h12, h22, i)
            for j in tl.static_range(6):
                _point_out(_filter_row(t0, t1, t2, j), 6 * i + j, u_ptr, largest_ptr, scale_ptr, offsets, mask,
                           program, point_stride, SCALED)


def _launch_pass(weight: Tensor, u_out: Tensor, largest: Tensor, scales: Tensor, scaled: bool) -> None:
    """One pass of `_points_kernel` over `weight`: the programs' largest magnitudes per point into `largest`, or
    (`scaled`) the points times `scales` into `u_out` (the other pass's pointer is passed and not read)."""
    out_channels, in_channels, taps = weight.shape[:3]
    launch(_points_kernel, _grid(weight), weight, u_out, largest, scales, in_channels, out_channels,
           taps * in_channels, *weight.stride(), SCALED=scaled, BLOCK_R=BLOCK_ROWS, BLOCK_O=BLOCK_COLUMNS,
           num_warps=4)


def _grid(weight: Tensor) -> tuple[int, int]:
    out_channels, in_channels, taps = weight.shape[:3]
    return triton.cdiv(taps * in_channels, BLOCK_ROWS), triton.cdiv(out_channels, BLOCK_COLUMNS)


def point_scales_4_into(weight: Tensor, scales_out: Tensor) -> None:
    """The first pass: `transforms.transformed_weight_4(weight)`'s 36 point scales into `scales_out` ([36] fp32).
    Its one temporary holds the programs' maxima (36 fp32 values a program: under 1 MB at 1024 -> 1024)."""
    grid = _grid(weight)
    largest = torch.empty(grid[0] * grid[1], POINTS_4, dtype=torch.float32, device=weight.device)
    _launch_pass(weight, scales_out, largest, scales_out, scaled=False)
    scales_out.copy_(power_of_two_at_most(FP16_TARGET / largest.amax(dim=0)))


def scaled_points_4_into(weight: Tensor, scales: Tensor, u_out: Tensor) -> None:
    """The second pass: `weight`'s points times `scales` (as `point_scales_4_into` wrote them), rounded to fp16
    into `u_out` (fp16 [36, kt * C, O], contiguous)."""
    _launch_pass(weight, u_out, scales, scales, scaled=True)


def transformed_weight_4_into(weight: Tensor, u_out: Tensor, scales_out: Tensor) -> None:
    """`transforms.transformed_weight_4` of a bf16/fp16/fp32 [O, C, kt, 3, 3] weight (any strides) into `u_out`
    (fp16 [36, kt * C, O], contiguous) and `scales_out` ([36] fp32), by the two passes of the module docstring."""
    point_scales_4_into(weight, scales_out)
    scaled_points_4_into(weight, scales_out, u_out)


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
