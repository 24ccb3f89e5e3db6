"""Triton kernels of the Wan causal conv's input assembly (cache frames, x, zero pad), each beside its launcher.

- `causal_pad`: `pad(cat([cache, x], 2), pad)` as one contiguous tensor (`rewrite::causal_conv_input`).
- `causal_pad_channels_last`: the same written channels-last, plus the next chunk's cache in the same pass
  (`rewrite::causal_conv3d`); `causal_pad_channels_last_folded`: that of a narrow input with a kernel row's
  columns folded into the channels (`rewrite::causal_conv3d_fast`).
- `causal_pad_rest_channels_last`: what the fused norm (`rewrite.kernels.norm.rms_norm.rms_norm_padded_channels_last`)
  leaves of that input: the cache frames, the zero pad and their next-cache rows.

Pure data movement (the bits of x and the cache are copied), so exact on every device and dtype; launched
with the exact flags all the same (`rewrite.kernels.launch.launch`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rewrite.ops.dispatch import triton
from rewrite.kernels.launch import FlatBlock, Tile, launch

PAD_TILE = 4096  # elements per program of the causal pad kernel (rows x columns, both powers of two)

if triton is not None:
    import triton.language as tl

    from rewrite.kernels.index import plane_coords as _plane

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
    def _output_row(TO, HO):
        """The program's output row along axis 0 of the channels-last padded input: (row, h, t, b as int64)."""
        row = tl.program_id(0)
        r = row // HO
        return row, row % HO, r % TO, (r // TO).to(tl.int64)

    @triton.jit
    def _causal_pad_cl_kernel(x_ptr, cache_ptr, out_ptr, next_ptr, C, CO, TO, HO, WO, TC, H, W, PT, PH, PW, TS,
                              sx0, sx1, sx2, sx3, sx4, sc0, sc1, sc2, sc3, sc4,
                              HAS_CACHE: tl.constexpr, NEXT_CACHE: tl.constexpr, BLOCK_W: tl.constexpr,
                              BLOCK_C: tl.constexpr):
        """`_causal_pad_kernel` writing the padded input channels-last: out is [B, TO, HO, WO, CO] in memory, its
        channels from C on zero (CO > C: a narrow input widened for a conv that needs more channels).

        One output row (b, t, h) per program along axis 0, a BLOCK_W x BLOCK_C tile of it: read along w from
        the source frame's strided layout, stored along c (Triton moves the tile between the two layouts).
        TS = TC + (frames of x): the source frames; rows, columns and frames outside them are the zero pad.
        The rows of the last two temporal frames before the right pad (source frames, or the left pad's
        zeros when the source has fewer) are also stored, without the spatial pad, to the next cache
        ([B, 2, H, W, C] in memory): in every mode that is the next chunk's cache (not NEXT_CACHE: none).
        """
        row, h, t, b = _output_row(TO, HO)
        w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
        c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        out_mask = (w < WO)[:, None] & (c < CO)[None, :]
        hs = h - PH
        ws = w - PW
        ts = t - PT
        inside = out_mask & ((ws >= 0) & (ws < W))[:, None] & (c < C)[None, :]
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
        offsets = (row.to(tl.int64) * WO + w[:, None]) * CO + c[None, :]
        tl.store(out_ptr + offsets, value, mask=out_mask)
        if NEXT_CACHE:
            slot = ts - (TS - 2)  # 0 or 1 in the next cache's two frames
            if (slot >= 0) & (slot < 2) & (hs >= 0) & (hs < H):
                cache_rows = ((b * 2 + slot) * H + hs) * W
                tl.store(next_ptr + (cache_rows + ws[:, None]) * C + c[None, :], value, mask=inside)

    @triton.jit
    def _causal_pad_fold_cl_kernel(x_ptr, cache_ptr, out_ptr, next_ptr, C, CO, TO, HO, TC, H, W, PT, PH, TS,
                                   sx0, sx1, sx2, sx3, sx4, sc0, sc1, sc2, sc3, sc4, HAS_CACHE: tl.constexpr,
                                   KW: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
        """`_causal_pad_cl_kernel` with the KW columns a kernel row reads folded into the channels: out is
        [B, TO, HO, W, CO] in memory, channel k * C + c of column w holding the padded input's column w + k
        (channel c; the padded input has (KW - 1) // 2 zero columns each side), channels from KW * C on zero.
        The next cache ([B, 2, H, W, C] memory) is stored from the middle tap's lanes (k = (KW - 1) // 2:
        column w itself)."""
        row, h, t, b = _output_row(TO, HO)
        w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
        j = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        k = j // C
        c = j % C
        out_mask = (w < W)[:, None] & (j < CO)[None, :]
        ws = w[:, None] + (k - (KW - 1) // 2)[None, :]
        hs = h - PH
        ts = t - PT
        inside = out_mask & (j < KW * C)[None, :] & (ws >= 0) & (ws < W)
        value = tl.zeros([BLOCK_W, BLOCK_C], dtype=out_ptr.dtype.element_ty)  # the zero pad
        if (hs >= 0) & (hs < H) & (ts >= 0) & (ts < TS):
            if ts >= TC:
                base = b * sx0 + (ts - TC) * sx2 + hs * sx3
                value = tl.load(x_ptr + base + c[None, :].to(tl.int64) * sx1 + ws * sx4, mask=inside, other=0.0)
            elif HAS_CACHE:
                base = b * sc0 + ts * sc2 + hs * sc3
                value = tl.load(cache_ptr + base + c[None, :].to(tl.int64) * sc1 + ws * sc4, mask=inside,
                                other=0.0)
        tl.store(out_ptr + (row.to(tl.int64) * W + w[:, None]) * CO + j[None, :], value, mask=out_mask)
        slot = ts - (TS - 2)  # 0 or 1 in the next cache's two frames
        if (slot >= 0) & (slot < 2) & (hs >= 0) & (hs < H):
            middle = inside & (k == (KW - 1) // 2)[None, :]
            cache_rows = ((b * 2 + slot) * H + hs) * W
            tl.store(next_ptr + (cache_rows + w[:, None]) * C + c[None, :], value, mask=middle)

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
        row, h, t, b = _output_row(TO, HO)
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
        launch(_causal_pad_kernel, grid, x, source, out, c, frames_out, rows_out, columns_out, tc, tx, h, w, tl_, hl,
               wl, h_blocks, *x.stride(), *source.stride(), HAS_CACHE=cache is not None, ROWS=rows_per_program,
               BLOCK_W=block_w, num_warps=4)
    return out


# Tiles of the channels-last pad kernel (H200 sweep: docs/tuning.md section 5, "Channels-last data movement")
PAD_CL_TILE = Tile(positions=64, channels=0, warps=4)
PAD_CL_TILE_FEW_CHANNELS = Tile(positions=64, channels=128, warps=8)  # up to 128 channels: all in one block
PAD_CL_TILE_NARROW = Tile(positions=256, channels=16, warps=4)  # up to 16 channels (a video's 3, widened to 16)


def _pad_cl_tile(out_channels: int) -> Tile:
    """The channels-last pad kernels' tile for a padded input of `out_channels` channels."""
    if out_channels <= PAD_CL_TILE_NARROW.channels:
        return PAD_CL_TILE_NARROW
    return PAD_CL_TILE_FEW_CHANNELS if out_channels <= PAD_CL_TILE_FEW_CHANNELS.channels else PAD_CL_TILE


def _padded_channels_last(x: Tensor, cache: Tensor | None, pad: list[int], next_cache: Tensor | None = None,
                          out_channels: int | None = None, columns: int | None = None) -> tuple[Tensor, Tensor]:
    """Empty (padded input, next cache), channels-last, for `causal_pad_channels_last`; `next_cache`: the
    buffer to write the next cache into instead of a new one (checked); `out_channels`: the padded input's
    channel count (default x's; at least x's); `columns`: its width (default x's padded width)."""
    wl, wr, hl, hr, tl_, tr = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    if tl_ + tc + tx < 2:
        raise ValueError(f"causal_pad_channels_last: {tl_ + tc + tx} frames before the right pad, the cache needs 2")
    if out_channels is not None and out_channels < c:
        raise ValueError(f"causal_pad_channels_last: out_channels {out_channels} is fewer than x's {c} channels")
    shape = (b, out_channels or c, tl_ + tc + tx + tr, hl + h + hr, wl + w + wr if columns is None else columns)
    out = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    if next_cache is None:
        next_cache = torch.empty((b, c, 2, h, w), dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    elif (tuple(next_cache.shape) != (b, c, 2, h, w) or next_cache.dtype != x.dtype or next_cache.device != x.device
          or not next_cache.is_contiguous(memory_format=torch.channels_last_3d)):
        raise ValueError(f"causal pad: the next cache buffer must be a channels-last {(b, c, 2, h, w)} {x.dtype} "
                         f"tensor on {x.device}, got {tuple(next_cache.shape)} {next_cache.dtype} on "
                         f"{next_cache.device}")
    return out, next_cache


PAD_REST_BLOCK = FlatBlock(values=8192, warps=8)  # `_causal_pad_rest_cl_kernel`


def _shares_memory(a: Tensor, b: Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def causal_pad_rest_channels_last(x: Tensor, cache: Tensor | None, pad: list[int],
                                  next_cache: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """`causal_pad_channels_last` without the positions that come from x (nor their next-cache copies):
    `rms_norm_padded_channels_last` has the norm kernel write those. The cache is read channels-last (copied
    so first if it is not). `next_cache`: a buffer for the next cache instead of a new tensor; it may be the
    cache itself where x has two frames or more (then this kernel writes no next-cache rows, it only reads
    the cache, and the norm kernel that runs after it writes them all from x)."""
    if next_cache is not None and cache is not None and x.shape[2] < 2 and _shares_memory(next_cache, cache):
        raise ValueError(f"causal_pad_rest_channels_last: the next cache can be written over the cache only from "
                         f"two frames of x or more, got {x.shape[2]}")
    out, next_cache = _padded_channels_last(x, cache, pad, next_cache)
    wl, _, hl, _, tl_, _ = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    if cache is not None and (cache.stride(1) != 1 or cache.stride(4) != c):  # (w, c) of a row not one run
        cache = cache.contiguous(memory_format=torch.channels_last_3d)
    source = out if cache is None else cache  # not read without a cache
    _, _, frames_out, rows_out, columns_out = out.shape
    if out.numel():
        row = columns_out * c
        block = PAD_REST_BLOCK
        launch(_causal_pad_rest_cl_kernel, (b * frames_out * rows_out, triton.cdiv(row, block.values)),
               source, out, next_cache, frames_out, rows_out, h, tc, tl_, hl, tc + tx, row, wl * c, (wl + w) * c,
               source.stride(0), source.stride(2), source.stride(3), HAS_CACHE=cache is not None, BLOCK=block.values,
               num_warps=block.warps)
    return out, next_cache


def _launch_pad_cl(x: Tensor, cache: Tensor | None, pad: list[int], out: Tensor, next_cache: Tensor | None) -> None:
    """`_causal_pad_cl_kernel` writing `out` (and `next_cache`, unless None) from x and the cache frames."""
    wl, _, hl, _, tl_, _ = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    source = x if cache is None else cache
    _, out_channels, frames_out, rows_out, columns_out = out.shape
    if out.numel():
        tile = _pad_cl_tile(out_channels)
        block_c = tile.block_channels(out_channels)
        grid = (b * frames_out * rows_out, triton.cdiv(columns_out, tile.positions), triton.cdiv(out_channels, block_c))
        launch(_causal_pad_cl_kernel, grid, x, source, out, out if next_cache is None else next_cache, c,
               out_channels, frames_out, rows_out, columns_out, tc, h, w, tl_, hl, wl, tc + tx, *x.stride(),
               *source.stride(), HAS_CACHE=cache is not None, NEXT_CACHE=next_cache is not None, BLOCK_W=tile.positions,
               BLOCK_C=block_c, num_warps=tile.warps)


def causal_pad_channels_last(x: Tensor, cache: Tensor | None, pad: list[int],
                             out_channels: int | None = None) -> tuple[Tensor, Tensor]:
    """(`pad(cat([cache, x], 2), pad)` (or `pad(x, pad)`), its last two frames before the right pad without the
    spatial pad) written in one pass, both channels-last (NDHWC memory). The second is the next chunk's cache
    in every mode of `rewrite.models.wan.reference.next_cache_reference` (its values; its layout is channels-last).
    With `out_channels` above x's channel count the first carries that many channels, the ones past x's zero
    (the next cache keeps x's)."""
    out, next_cache = _padded_channels_last(x, cache, pad, out_channels=out_channels)
    _launch_pad_cl(x, cache, pad, out, next_cache)
    return out, next_cache


def pad_channels_last(x: Tensor, pad: list[int], cache: Tensor | None = None) -> Tensor:
    """`pad(x, pad)` (with `cache`: `pad(cat([cache, x], 2), pad)`) of a 5-D x (any strides; `pad` as for `F.pad`,
    six values) written channels-last (NDHWC memory) in one pass: `causal_pad_channels_last`'s kernel without a
    next cache."""
    wl, wr, hl, hr, tl_, tr = pad
    b, c, tx, h, w = x.shape
    tc = 0 if cache is None else cache.shape[2]
    out = torch.empty((b, c, tl_ + tc + tx + tr, hl + h + hr, wl + w + wr), dtype=x.dtype, device=x.device,
                      memory_format=torch.channels_last_3d)
    _launch_pad_cl(x, cache, pad, out, None)
    return out


def causal_pad_channels_last_folded(x: Tensor, cache: Tensor | None, pad: list[int], kernel_width: int,
                                    out_channels: int) -> tuple[Tensor, Tensor]:
    """`causal_pad_channels_last` of a narrow x for a conv `kernel_width` wide whose columns are folded into the
    channels: the first output is [B, out_channels, T', H', W] channels-last, channel k * C + c of column w
    the padded input's column w + k, channel c (zeros past kernel_width * C channels), so that a conv with
    kernel width 1 over it, its weight folded the same way, is the conv of the padded input; the second is the
    next cache, as `causal_pad_channels_last`'s. The width pad must be (kernel_width - 1) // 2 each side."""
    wl, wr, hl, hr, tl_, tr = pad
    b, c, tx, h, w = x.shape
    if kernel_width % 2 == 0 or wl != wr or wl != (kernel_width - 1) // 2:
        raise ValueError(f"causal_pad_channels_last_folded: a width pad of {(kernel_width - 1) // 2} each side "
                         f"for a kernel {kernel_width} wide, got {wl}, {wr}")
    if kernel_width * c > out_channels:
        raise ValueError(f"causal_pad_channels_last_folded: {kernel_width} x {c} channels exceed {out_channels}")
    tc = 0 if cache is None else cache.shape[2]
    out, next_cache = _padded_channels_last(x, cache, pad, out_channels=out_channels, columns=w)
    _, _, frames_out, rows_out, _ = out.shape
    source = x if cache is None else cache
    if out.numel():
        tile = _pad_cl_tile(out_channels)
        block_c = tile.block_channels(out_channels)
        grid = (b * frames_out * rows_out, triton.cdiv(w, tile.positions), triton.cdiv(out_channels, block_c))
        launch(_causal_pad_fold_cl_kernel, grid, x, source, out, next_cache, c, out_channels, frames_out, rows_out,
               tc, h, w, tl_, hl, tc + tx, *x.stride(), *source.stride(), HAS_CACHE=cache is not None,
               KW=kernel_width, BLOCK_W=tile.positions, BLOCK_C=block_c, num_warps=tile.warps)
    return out, next_cache
