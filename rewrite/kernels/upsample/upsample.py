"""Triton kernels of the Wan upsamplers' data movement (nearest-exact 2x, the temporal frame interleave) and the Wan
2.2 DupUp3D shortcut add, beside their launchers.

- `upsample_nearest2x`: pixel duplication from any strides into the layout ATen's op gives
  (`rewrite::upsample_nearest2x`); `upsample_nearest2x_channels_last`: the same written channels-last, the
  input of cuDNN's conv in `rewrite::upsample_conv2d`.
- `temporal_interleave`: Wan's upsample3d frame interleave, ``[b, 2c, t, h, w] -> [b, c, 2t, h, w]`` in one copy
  (`rewrite::temporal_interleave`; ATen's stack runs two strided copies).
- `dup_up_add`: `main + DupUp3D(x)[:, :, first_frame:]`, the shortcut gathered from x in one pass
  (`rewrite::dup_up_add`; the fused form is `rewrite.kernels.epilogue.epilogue.conv_epilogue`'s `dup_up`).

Data movement, and one add with ATen's rounding: exact on every device and dtype (launched with the exact
flags of `rewrite.kernels.launch.launch`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rewrite.ops.dispatch import triton
from rewrite.kernels.layout import add_contiguous_layout, reference_layout
from rewrite.kernels.launch import Tile, launch, launch_flat
from rewrite.kernels.upsample.reference import temporal_interleave_reference, upsample_nearest2x_reference

if triton is not None:
    import triton.language as tl

    from rewrite.kernels.index import position as _position
    from rewrite.kernels.aten_math import round_to as _round

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
    def _temporal_interleave_kernel(y_ptr, out_ptr, numel, C, T2, H, W, sy0, sy1, sy2, sy3, sy4,
                                    so0, so1, so2, so3, so4, BLOCK: tl.constexpr):
        """out[b, c, t2] = y[b, (t2 % 2) * C + c, t2 // 2] for out [B, C, T2, H, W]; both any strides."""
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < numel
        b, c, t2, h, w = _position(i, C, T2, H, W)
        value = tl.load(y_ptr + b * sy0 + ((t2 % 2) * C + c) * sy1 + (t2 // 2) * sy2 + h * sy3 + w * sy4, mask=mask,
                        other=0.0)
        tl.store(out_ptr + b * so0 + c * so1 + t2 * so2 + h * so3 + w * so4, value, mask=mask)

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


# The channels-last upsample tile (H200 sweep: docs/tuning.md section 5, "Channels-last data movement")
UPSAMPLE_CL_TILE = Tile(positions=64, channels=0, warps=4)


def upsample_nearest2x(x: Tensor, upcast: bool) -> Tensor:
    """Nearest-exact 2x of [N, C, H, W] (pixel duplication) from any strides, in the layout ATen's op gives."""
    n, c, h, w = x.shape
    strides = reference_layout(("upsample_nearest2x", upcast), lambda a: upsample_nearest2x_reference(a, upcast), x)
    out = torch.empty_strided((n, c, 2 * h, 2 * w), strides, dtype=x.dtype, device=x.device)
    launch_flat(_upsample2x_kernel, out.numel(), x, out, out.numel(), c, 2 * h, 2 * w, *x.stride(), *out.stride())
    return out


def upsample_nearest2x_channels_last(x: Tensor) -> Tensor:
    """Nearest-exact 2x of [N, C, H, W] (pixel duplication) from any strides, written channels-last."""
    n, c, h, w = x.shape
    out = torch.empty((n, c, 2 * h, 2 * w), dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if out.numel():
        tile = UPSAMPLE_CL_TILE
        block_c = tile.block_channels(c)
        grid = (n * 2 * h, triton.cdiv(2 * w, tile.positions), triton.cdiv(c, block_c))
        launch(_upsample2x_cl_kernel, grid, x, out, c, 2 * h, 2 * w, *x.stride(), BLOCK_W=tile.positions,
               BLOCK_C=block_c, num_warps=tile.warps)
    return out


def temporal_interleave(y: Tensor) -> Tensor:
    """``[b, 2c, t, h, w] -> [b, c, 2t, h, w]``, channel half k of frame t becoming frame 2t + k, from any strides
    into the layout ATen's reshape + stack + reshape gives (contiguous, or channels-last for such a y)."""
    b, c2, t, h, w = y.shape
    if c2 % 2:
        raise ValueError(f"temporal_interleave: an even channel count expected, got {c2}")
    strides = reference_layout(("temporal_interleave",), temporal_interleave_reference, y)
    out = torch.empty_strided((b, c2 // 2, 2 * t, h, w), strides, dtype=y.dtype, device=y.device)
    launch_flat(_temporal_interleave_kernel, out.numel(), y, out, out.numel(), c2 // 2, 2 * t, h, w, *y.stride(),
                *out.stride())
    return out


def dup_up_add(main: Tensor, x: Tensor, repeats: int, factor_t: int, factor_s: int, first_frame: int) -> Tensor:
    """`main + DupUp3D(x)[:, :, first_frame:]` gathered in one pass."""
    strides = add_contiguous_layout(main, contiguous_first=False)
    out = torch.empty_strided(main.shape, strides, dtype=main.dtype, device=main.device)
    b, c, t, h, w = main.shape
    launch_flat(_dup_up_add_kernel, out.numel(), main, x, out, out.numel(), c, t, h, w, repeats, factor_t, factor_s,
                first_frame, *main.stride(), *x.stride(), *out.stride())
    return out
