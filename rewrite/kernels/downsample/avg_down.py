"""Triton kernel of Wan 2.2's `AvgDown3D` shortcut plus the residual add that ends `WanResidualDownBlock`, beside
its launcher.

`avg_down_add(main, x, pad_t, factor_t, factor_s, group)`: ``main + AvgDown3D(x)`` in one pass. The shortcut pads
x by `pad_t` zero frames in front, unfolds each (factor_t, factor_s, factor_s) block of positions into channels
(channel ``((c * factor_t + i) * factor_s + j) * factor_s + l`` of the unfolded tensor holds x[c] at offset
(i, j, l)), and averages each run of `group` consecutive unfolded channels into one output channel. ATen runs that
as a pad, a permuted copy, a mean and an add (four passes over the block input or its quarter); here each output
gathers its `group` inputs straight from x.

Arithmetic: the `group` values summed in fp32 into four partial sums (value g into sum g % 4, in order of g), the
partial sums added left to right, times 1 / group, rounded to x's dtype, then added to `main` in fp32 and rounded
once: the order and rounding points of ATen's CUDA mean over a non-innermost dim of a few values (one thread
per output, four accumulators: `Reduce.cuh`) and of its add, as read from ATen's source and held to
`torch.equal` by the GPU test; any strides in, the output in the layout ATen's add gives.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rewrite.kernels.launch import BLOCK, launch, plane_grid
from rewrite.kernels.layout import add_contiguous_layout
from rewrite.ops.dispatch import triton

if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import round_to as _round
    from rewrite.kernels.index import plane_coords as _plane

    @triton.jit
    def _avg_down_add_kernel(main_ptr, x_ptr, out_ptr, C_OUT, T_OUT, H_OUT, W_OUT, PAD_T,
                             sm0, sm1, sm2, sm3, sm4, sx0, sx1, sx2, sx3, sx4, so0, so1, so2, so3, so4,
                             FT: tl.constexpr, FS: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr):
        """One output plane (b, o, t) per program along axis 0, BLOCK of its positions along axis 1: the group's
        source channels and frames are the program's scalars, the positions 32-bit (the divisions per element
        are what 64-bit index math made slow in the DupUp epilogue: docs/tuning.md 1.3), offsets 64-bit."""
        b, o, t = _plane(tl.program_id(0), C_OUT, T_OUT)
        s = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = s < H_OUT * W_OUT
        h = (s // W_OUT).to(tl.int64)
        w = (s % W_OUT).to(tl.int64)
        sums0 = tl.zeros([BLOCK], dtype=tl.float32)
        sums1 = tl.zeros([BLOCK], dtype=tl.float32)
        sums2 = tl.zeros([BLOCK], dtype=tl.float32)
        sums3 = tl.zeros([BLOCK], dtype=tl.float32)
        for g in tl.static_range(GROUP):
            unfolded = o * GROUP + g
            offset = unfolded % (FT * FS * FS)
            frame = t * FT + offset // (FS * FS) - PAD_T  # the pad's frames are zeros
            src = (x_ptr + (b * sx0 + (unfolded // (FT * FS * FS)) * sx1 + frame * sx2)
                   + (h * FS + (offset // FS) % FS) * sx3 + (w * FS + offset % FS) * sx4)
            value = tl.load(src, mask=mask & (s * 0 + frame >= 0), other=0.0).to(tl.float32)  # a vector mask
            if g % 4 == 0:
                sums0 += value
            elif g % 4 == 1:
                sums1 += value
            elif g % 4 == 2:
                sums2 += value
            else:
                sums3 += value
        mean = _round(((sums0 + sums1) + sums2 + sums3) * (1.0 / GROUP), x_ptr.dtype.element_ty)
        m = tl.load(main_ptr + (b * sm0 + o * sm1 + t * sm2) + h * sm3 + w * sm4, mask=mask, other=0.0)
        out = _round(m.to(tl.float32) + mean.to(tl.float32), out_ptr.dtype.element_ty)
        tl.store(out_ptr + (b * so0 + o * so1 + t * so2) + h * so3 + w * so4, out, mask=mask)


MAX_GROUP = 8  # Wan 2.2's groups: 1, 2, 4, 8


def avg_down_shape(x_shape, pad_t: int, factor_t: int, factor_s: int, group: int) -> tuple[int, ...]:
    """[B, C * factor_t * factor_s**2 / group, (T + pad_t) / factor_t, H / factor_s, W / factor_s] of x's
    [B, C, T, H, W]."""
    b, c, t, h, w = x_shape
    return (b, c * factor_t * factor_s * factor_s // group, (t + pad_t) // factor_t, h // factor_s, w // factor_s)


def avg_down_add_reason(main_shape, x_shape, pad_t: int, factor_t: int, factor_s: int, group: int) -> str | None:
    """None where `avg_down_add` serves these shapes, else why not."""
    if len(x_shape) != 5:
        return f"x is {len(x_shape)}-D (a [B, C, T, H, W] tensor is needed)"
    if min(factor_t, factor_s, group) < 1 or pad_t < 0:
        return f"factors ({factor_t}, {factor_s}), group {group}, pad {pad_t}: expected positive factors and group"
    b, c, t, h, w = x_shape
    if (t + pad_t) % factor_t or h % factor_s or w % factor_s or (c * factor_t * factor_s * factor_s) % group:
        return (f"x {tuple(x_shape)} padded by {pad_t} frames does not unfold by ({factor_t}, {factor_s}, "
                f"{factor_s}) into groups of {group}")
    if group > MAX_GROUP:
        return f"a group of {group} (the kernel unrolls at most {MAX_GROUP} values per output)"
    shape = avg_down_shape(x_shape, pad_t, factor_t, factor_s, group)
    if tuple(main_shape) != shape:
        return f"main {tuple(main_shape)} is not the shortcut's {shape}"
    return None


def avg_down_add(main: Tensor, x: Tensor, pad_t: int, factor_t: int, factor_s: int, group: int) -> Tensor:
    """``main + AvgDown3D(x)`` of the module docstring, in the layout ATen's add of `main` and the mean's
    contiguous output gives."""
    reason = avg_down_add_reason(main.shape, x.shape, pad_t, factor_t, factor_s, group)
    if reason is not None:
        raise ValueError(f"avg_down_add: {reason}")
    if main.dtype != x.dtype:
        raise ValueError(f"avg_down_add: main is {main.dtype}, x {x.dtype} (one dtype expected)")
    out = torch.empty_strided(main.shape, add_contiguous_layout(main, contiguous_first=False), dtype=main.dtype,
                              device=main.device)
    b, c_out, t_out, h_out, w_out = main.shape
    if out.numel():
        launch(_avg_down_add_kernel, plane_grid(b, c_out, t_out, h_out * w_out), main, x, out, c_out, t_out, h_out,
               w_out, pad_t, *main.stride(), *x.stride(), *out.stride(), FT=factor_t, FS=factor_s, GROUP=group,
               BLOCK=BLOCK)
    return out
