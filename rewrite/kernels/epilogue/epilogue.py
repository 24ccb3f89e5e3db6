"""Triton conv epilogues, shared by the Wan and AuK ops: a conv's deferred bias (+ residual) with ATen's roundings.

ATen's CUDA conv adds its bias with a separate `add_` after cuDNN (one rounding), then the residual add (a
second); these kernels add both, with those two roundings, in one pass over the conv output computed
without its bias:

- `conv_epilogue`: reads a conv output whose (h, w) positions form one strided run (channels-last as cuDNN
  returns it) along the channels and writes the layout the replaced subgraph had; optionally adds a
  residual's own deferred bias first, or gathers Wan 2.2's DupUp3D shortcut as the residual; or gathers each
  output pixel from the phase conv of a 2x upsample (`rewrite.models.wan.upsample_fast.phase_conv`).
- `bias_residual`: `y.add_(bias) + residual` for any strides (`rewrite::conv3d_residual`, and the AuK fused
  activation + conv with a residual, `rewrite::alias_free_snake_causal_conv1d`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from rewrite.ops.dispatch import triton
from rewrite.kernels.layout import planes_contiguous, reference_layout, run_stride
from rewrite.kernels.launch import BLOCK, Tile, launch, launch_flat, plane_grid

if triton is not None:
    import triton.language as tl

    from rewrite.kernels.index import plane_coords as _plane
    from rewrite.kernels.index import position as _position
    from rewrite.kernels.aten_math import round_to as _round

    @triton.jit
    def _conv_epilogue_kernel(y_ptr, bias_ptr, res_ptr, rb_ptr, dup_ptr, out_ptr, C, T, S, W, sy0, sy1, sy2, sys_, syh,
                              syw, sr0, sr1, sr2, srs, sd0, sd1, sd2, sd3, sd4, so0, so1, so2, sos, FIRST,
                              REPEATS: tl.constexpr, FT: tl.constexpr, FS: tl.constexpr, HAS_BIAS: tl.constexpr,
                              HAS_RESIDUAL: tl.constexpr, HAS_RES_BIAS: tl.constexpr, HAS_DUP: tl.constexpr,
                              PHASES: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
        """out = round(round(y + bias) + residual) (each part optional) with ATen's roundings (the conv's
        bias `add_`, then the residual add), for tensors whose (h, w) positions are one strided run of S
        (`s*s` strides): reads the channels-last conv output along c and writes the output (and reads the
        residual) in their own layouts. With HAS_DUP the residual is Wan 2.2's DupUp3D shortcut of `dup`
        (`_dup_up_add_kernel`'s gather; W is the output width). With HAS_RES_BIAS the residual is a conv
        output whose bias (at rb_ptr) was deferred: round(residual + bias) first, as ATen's `add_`. With PHASES y
        is a 2x upsample's phase conv ([b, 4C, t, H/2 + 1, W/2 + 1], h / w strides syh / syw): output pixel
        (2i + ph, 2j + pw) reads channels (2ph + pw) * C.. at (i + ph, j + pw). One (b, t) plane per program
        along axis 0, a BLOCK_S x BLOCK_C tile."""
        plane = tl.program_id(0)
        t32 = plane % T
        sp32 = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
        c32 = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        b = (plane // T).to(tl.int64)
        t = t32.to(tl.int64)
        sp = sp32.to(tl.int64)
        c = c32.to(tl.int64)
        mask = (sp < S)[:, None] & (c < C)[None, :]
        if PHASES:  # 32-bit position math (positions fit), the offsets in int64
            ph = (sp32 // W) % 2
            pw = (sp32 % W) % 2
            position = ((sp32 // W) // 2 + ph).to(tl.int64) * syh + ((sp32 % W) // 2 + pw).to(tl.int64) * syw
            channel = ((2 * ph + pw) * C).to(tl.int64)[:, None] + c[None, :]
            y = tl.load(y_ptr + (b * sy0 + t * sy2) + position[:, None] + channel * sy1, mask=mask, other=0.0)
        else:
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


# Tiles of the conv epilogue (H200 sweep: docs/tuning.md section 5, "Channels-last data movement")
EPILOGUE_TILE = Tile(positions=128, channels=64, warps=8)
DUP_UP_EPILOGUE_TILE = Tile(positions=128, channels=64, warps=8)  # with the DupUp3D gather


class DupUp(NamedTuple):
    """Wan 2.2's DupUp3D shortcut of `x` as `conv_epilogue`'s residual: x's channels repeated `repeats` times,
    unfolded into (`factor_t`, `factor_s`, `factor_s`) steps of (t, h, w), its first `first_frame` frames dropped."""

    x: Tensor
    repeats: int
    factor_t: int
    factor_s: int
    first_frame: int


def conv_epilogue(y: Tensor, bias: Tensor | None, residual: Tensor | None, out_strides: tuple[int, ...],
                  dup_up: DupUp | None = None,
                  residual_bias: Tensor | None = None, phases: bool = False) -> Tensor:
    """`y.add_(bias) [+ residual]` with ATen's roundings into a new tensor of `out_strides` (y is a conv
    output without its bias, any layout whose (h, w) positions form one strided run). `dup_up` adds
    `DupUp3D(x)[:, :, first_frame:]` as the residual (`DupUp`; `dup_up_add`'s gather; not with `residual`).
    `residual_bias`: the residual is a conv output without its bias, added first (`residual.add_(residual_bias)`'s
    rounding). `phases`: y [b, 4 * C, t, H + 1, W + 1] is the phase conv of a 2x upsample
    (`wan_upsample_fast.phase_conv`'s output, any strides) and the output [b, C, t, 2H, 2W] gathers pixel
    (2i + ph, 2j + pw) from channels (2 * ph + pw) * C.. at (i + ph, j + pw)."""
    if residual is not None and dup_up is not None:
        raise ValueError("conv_epilogue: a residual or a DupUp3D shortcut, not both")
    if residual_bias is not None and residual is None:
        raise ValueError("conv_epilogue: residual_bias without a residual")
    shape = tuple(y.shape)
    if phases:
        if y.shape[1] % 4 or y.shape[3] < 1 or y.shape[4] < 1:
            raise ValueError(f"conv_epilogue: a phase conv output is [b, 4 * C, t, H + 1, W + 1], got {shape}")
        shape = (y.shape[0], y.shape[1] // 4, y.shape[2], 2 * (y.shape[3] - 1), 2 * (y.shape[4] - 1))
    out = torch.empty_strided(shape, out_strides, dtype=y.dtype, device=y.device)
    res = residual if residual is not None else out
    runs = [run_stride(t) for t in (out if phases else y, res, out)]
    if None in runs:
        raise ValueError(f"conv_epilogue: (h, w) not one strided run in strides {[t.stride() for t in (y, res, out)]}")
    dup, repeats, factor_t, factor_s, first = dup_up if dup_up is not None else (out, 1, 1, 1, 0)
    b, c, t, h, w = out.shape
    if out.numel():
        tile = EPILOGUE_TILE if dup_up is None else DUP_UP_EPILOGUE_TILE
        block_c = tile.block_channels(c)
        grid = (b * t, triton.cdiv(h * w, tile.positions), triton.cdiv(c, block_c))
        launch(_conv_epilogue_kernel, grid, y, y if bias is None else bias, res,
               res if residual_bias is None else residual_bias, dup, out, c, t, h * w, w,
               *y.stride()[:3], runs[0], *y.stride()[3:], *res.stride()[:3], runs[1], *dup.stride(),
               *out.stride()[:3], runs[2], first, REPEATS=repeats, FT=factor_t, FS=factor_s,
               HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
               HAS_RES_BIAS=residual_bias is not None, HAS_DUP=dup_up is not None, PHASES=phases,
               BLOCK_S=tile.positions, BLOCK_C=block_c, num_warps=tile.warps)
    return out


def bias_residual(y: Tensor, bias: Tensor | None, residual: Tensor) -> Tensor:
    """`y.add_(bias) + residual` with ATen's two roundings (y is a conv output without its bias)."""
    strides = reference_layout(("add",), torch.add, y, residual)
    out = torch.empty_strided(y.shape, strides, dtype=y.dtype, device=y.device)
    b, c, t, h, w = y.shape
    if out.numel() and planes_contiguous(y, residual, out):
        launch(_bias_residual_plane_kernel, plane_grid(b, c, t, h * w),
               y, y if bias is None else bias, residual, out, c, t, h * w, *y.stride()[:3], *residual.stride()[:3],
               *out.stride()[:3], HAS_BIAS=bias is not None, BLOCK=BLOCK)
    else:
        launch_flat(_bias_residual_kernel, out.numel(), y, y if bias is None else bias, residual, out, out.numel(),
                    c, t, h, w, *y.stride(), *residual.stride(), *out.stride(), HAS_BIAS=bias is not None)
    return out
