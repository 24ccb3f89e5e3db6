"""A dense conv3d over a pre-padded channels-last input, as one Triton implicit-GEMM kernel (Hopper: TMA loads).

Computes, for ``padded`` ``[B, C, Tp, Hp, Wp]`` in channels-last memory (NDHWC; the causal and spatial zero
pad already in it, as `triton_pad.causal_pad_channels_last` and `triton_norm.rms_norm_padded_channels_last`
write it) and a channels-last ``weight`` ``[O, C, kt, kh, kw]``::

    out[b, o, t, h, w] = sum_{i, j, k, c} weight[o, c, i, j, k] * padded[b, c, t + i, h + j, w + k]
                         (+ bias[o]) (+ residual[b, o, t, h, w] (+ residual_bias[o]))

i.e. ``conv3d(padded, weight, bias) + residual`` (unit stride, no padding), written into an output of any
strides the caller allocates (the layout the replaced subgraph had, or channels-last for a raw conv output
that another fused op reads). The Wan ``channels_last`` level runs its 3x3x3 causal convs here where the
`chosen` table says this kernel beats cuDNN's (docs/tuning.md section 1).

Kernel: one program computes ``ROWS`` (1 or 2) adjacent output rows ``(b, t, h..)`` of ``BLOCK_W``
consecutive pixels by ``BLOCK_N`` output channels, with ``N_REST`` more channels in a second accumulator
where one program holds every channel (96 = 64 + 32, 192 = 128 + 64: no MMA work spent on padding
channels). Each row has its own accumulator, so every operand tile stays a 2-D TMA box that the tensor cores
read from shared memory. For each tap ``(i, j, k)`` the input pixels of a row are ``BLOCK_W`` consecutive
rows of the ``[B*Tp*Hp*Wp, C]`` view of ``padded``, so a TMA descriptor loads the ``[BLOCK_W, BLOCK_K]``
operand tile directly (rows past the row end are other pixels or zero fill: their outputs are masked at the
store); the weight tile ``[BLOCK_N, BLOCK_K]`` is a TMA load of the ``[O, kt*kh*kw*C]`` view of the
channels-last weight (K-major, the layout the tensor cores read), shared by the program's rows. The
reduction runs tap by tap, channel block by channel block, in fp32; bias, the residual and its deferred bias
are added to the fp32 accumulator and the sum is rounded once to the activation dtype. `launch_config`
chooses the program shape per output width so that programs compute as few pixels past the row ends as
possible (`pixel_tile`). Outputs and residuals whose rows TMA can address (channels-last, NCDHW or
frame-major, `_row_view`, each with the channels as a dimension of its own so that a channel block past C is
clipped) are read and written through tensor descriptors, others by per-element pointers: the descriptors
keep the epilogue near 128 registers per thread, so two programs share an SM and one's epilogue overlaps the
other's main loop (docs/tuning.md sections 1.6 and 1.7).

Flat programs (`ConvTile.flat`, `launch_config` for rows its row tiles do not divide: Wan 2.1 480p's 416- and
208-wide rows): a program's ``BLOCK_W`` pixels are consecutive positions of the frame's output rows laid out
``Wp`` (the padded input's width) apart, so its input tiles stay one TMA box per tap and it computes only the
``kw - 1`` positions between one row's end and the next row's start, running on into row h + 1. Their
epilogue (`_flat_epilogue`) addresses the output, residual and next cache per element (`_pixels`) and stores the
normalized tile into the next padded input, whose rows are ``Wp`` wide too, with one TMA store (zeros at the
positions between rows: that buffer's pads). TMA stores at negative coordinates raise an illegal instruction on
the H200 (docs/tuning.md section 1.15).

Norm epilogue (`conv3d_channels_last_norm_padded`, the pair op of `rewrite.models.wan.ops_fast`): where one program
holds every output channel of its pixels (a ``2n + n`` split, or one channel block), it adds the bias, rounds
once, takes the Wan RMS norm over the channels (gamma, scale, SiLU) in fp32 with one rounding, and stores
the result by TMA straight into the next causal conv's padded channels-last input and next cache, so the
conv's own output is never written (`norm_launch_config`: the tile capped at 128 registers).

Exactness: ``tolerance`` (level ``channels_last`` only). bf16/fp16 products are exact in fp32; the sum runs in
another order than cuDNN's, and bias and residual are added before the one rounding (cuDNN + ATen round
the conv, then the bias add, then the residual add): differences of about one output ulp. fp32 is not served
(`unsupported_reason`): cuDNN's TF32 conv stays.

Preconditions (`unsupported_reason`): Triton with tensor descriptors, bf16/fp16 for every tensor, C a multiple
of 16 (O any: a tile is at least 16 channels, the weight rows past O zero-filled by TMA), the input and
weight channels-last with 16-byte aligned rows; a tile `tile_reason` accepts.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.kernels import cards, layout
from rewrite.kernels.conv3d import phase_weights as triton_phase_weights
from rewrite.ops.dispatch import INTERPRETING, triton
from rewrite.kernels.launch import launch

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton before host tensor descriptors
    TensorDescriptor = None

__all__ = ["ConvTile", "SUPPORTED_DTYPES", "chosen", "conv3d_channels_last", "conv3d_channels_last_folded",
           "conv3d_channels_last_norm_padded", "folded_taps", "launch_config", "norm_epilogue_chosen",
           "norm_epilogue_reason", "norm_launch_config", "phase_launch_config", "row_view_reason",
           "unsupported_reason", "upsample2x_conv2d_channels_last"]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
MIN_OUT_CHANNELS = 16  # the smallest tensor-core tile side


class ConvTile(NamedTuple):
    """A launch configuration: `rows` adjacent output rows of `block_w` pixels each (one accumulator per row)
    by `block_n` output channels per program, and with `n_rest` > 0 that many more channels in a second
    accumulator (one program then holds ``block_n + n_rest`` channels, e.g. 96 = 64 + 32 or 192 = 128 + 64,
    with no MMA work spent on padding channels); `block_k` input channels per step, `warps`, pipeline
    `stages`, `warp_specialize` (Triton's warp-specialized loop: producer warps issue the TMA loads),
    `max_registers` (Triton's `maxnreg`; ignored by the interpreter), `flat` (`rows` 1: the program's pixels
    run on from one output row into the next, the kernel's FLAT)."""

    block_w: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    n_rest: int = 0
    rows: int = 1
    warp_specialize: bool = False
    max_registers: Optional[int] = None  # ptxas's cap per thread (spilling past it): 128 lets two programs share an SM
    flat: bool = False  # block_w consecutive positions of rows laid out the padded width apart (kernel's FLAT)

    @property
    def pixels(self) -> int:
        """Output pixels per program."""
        return self.rows * self.block_w


MAX_ROWS = 2  # output rows per program the kernel unrolls (one accumulator each)


def _block_k(channels: int) -> int:
    return 64 if channels % 64 == 0 else 32 if channels % 32 == 0 else 16


def _computed_pixels(width: int, block_w: int) -> int:
    """Pixels that programs of `block_w` pixels compute for a row of `width`."""
    return -(-width // block_w) * block_w


def pixel_tile(width: Optional[int], pixels: int) -> tuple[int, int]:
    """(rows, block_w) of a `pixels`-pixel program for output rows of `width` pixels: the arrangement that
    computes the fewest pixels past the row end (rows of at least 64 pixels, the Hopper MMA's M; one row on a
    tie). E.g. 256 pixels: one row of 256 at width 1280, two of 128 at width 640 (no waste either way); 128
    pixels at width 320: two rows of 64 (5 per row, none wasted) rather than one of 128 (3 per row, 17%)."""
    if width is None:
        return 1, pixels
    best = None
    for rows in range(1, MAX_ROWS + 1):
        block_w = pixels // rows
        if block_w < 64 and rows > 1:
            break
        computed = _computed_pixels(width, block_w)
        if best is None or computed < best[0]:
            best = (computed, rows, block_w)
    return best[1], best[2]


# Per output channel count, the program shapes to choose from, best first: (pixels per program, block_n, n_rest,
# warps, stages); `launch_config` takes the one that computes the fewest pixels past the row ends (the first on
# a tie). Other counts take `_DEFAULT_TILES` with block_n the next power of two up to 128. 27 and 108 channels
# are Wan 2.1's and 2.2's heads folded (`_FOLDED_TAPS`). The winners of the sweeps: docs/tuning.md sections 1.7
# and 1.10.
_TILES = {96: ((256, 64, 32, 8, 4), (128, 64, 32, 4, 3)), 192: ((128, 128, 64, 8, 3),),
          27: ((256, 32, 0, 4, 4),), 108: ((128, 128, 0, 4, 3),)}  # the folded heads' inner convs (section 1.10)
_DEFAULT_TILES = ((128, 128, 0, 4, 4),)


def launch_config(in_channels: int, out_channels: int, width: Optional[int] = None, kernel_width: int = 3,
                  flat: bool = True) -> ConvTile:
    """The tile for a conv with these channel counts, output rows of `width` pixels and a kernel `kernel_width`
    wide (`_TILES`, each program shape arranged by `pixel_tile`; docs/tuning.md section 1: the H200 sweeps).
    With `flat`, a channel count in `_FLAT_CHANNELS` takes the flat form of that program shape where it
    computes fewer pixels past the row ends."""
    best = None
    for pixels, block_n, n_rest, warps, stages in _TILES.get(out_channels, _DEFAULT_TILES):
        if out_channels not in _TILES and triton is not None:
            # at least one tensor-core tile side: TMA zero-fills the weight rows past O (Wan's 96 -> 3 head)
            block_n = max(MIN_OUT_CHANNELS, min(block_n, triton.next_power_of_2(out_channels)))
        rows, block_w = pixel_tile(width, pixels)
        tile = ConvTile(block_w, block_n, _block_k(in_channels), warps, stages, n_rest, rows)
        if best is None or (width is not None and wasted_fraction(tile, width) < wasted_fraction(best, width)):
            best = tile
    if flat and width is not None and out_channels in _FLAT_CHANNELS:
        flat_tile = best._replace(block_w=best.pixels, rows=1, flat=True)
        if (tile_reason(flat_tile, out_channels, width + kernel_width - 1) is None
                and wasted_fraction(flat_tile, width, kernel_width) < wasted_fraction(best, width)):
            return flat_tile
    return best


# Per card (`rewrite.kernels.cards.name`): (in channels, out channels, output row width) -> the tile that card's
# own sweep measured faster than `launch_config`'s rule for a 3x3x3 conv of that shape (docs/tuning.md 1.20).
CARD_TILES: dict[str, dict[tuple[int, int, int], ConvTile]] = {
    "NVIDIA H100 80GB HBM3": {(384, 384, 480): ConvTile(256, 128, 64, 8, 3, 0, 1, flat=True),
                              (192, 384, 480): ConvTile(256, 128, 64, 8, 3, 0, 1, flat=True),
                              (320, 640, 160): ConvTile(128, 128, 64, 4, 4, 0, 1, flat=True),
                              (640, 640, 160): ConvTile(128, 128, 64, 4, 4, 0, 1, flat=True),
                              # Wan 2.2's encoder at 176x320: all 320 channels in one program (256 + 64)
                              (160, 320, 320): ConvTile(64, 256, 32, 8, 3, 64, 2),
                              (320, 320, 320): ConvTile(64, 256, 64, 8, 3, 64, 2)},
}


def card_launch_config(in_channels: int, out_channels: int, width: int, kernel_width: int,
                       device: torch.device) -> ConvTile:
    """`launch_config`'s tile, or the one `CARD_TILES` holds for this shape on `device`'s card."""
    tile = CARD_TILES.get(cards.name(device), {}).get((in_channels, out_channels, width))
    if tile is not None and kernel_width == 3:
        return tile
    return launch_config(in_channels, out_channels, width, kernel_width)


# Output channel counts whose programs may run flat (`launch_config`): over rows that the row tiles do not divide
# (Wan 2.1 480p's 192 channels 416 wide, 384 channels 208 wide; docs/tuning.md section 1.15).
_FLAT_CHANNELS = frozenset({192, 384})


def wasted_fraction(tile: ConvTile, width: int, kernel_width: int = 3) -> float:
    """The share of pixels `tile`'s programs compute past the ends of rows of `width` pixels (per pixel kept):
    a flat tile computes the kernel_width - 1 positions between one row's end and the next row's start."""
    if tile.flat:
        return (kernel_width - 1) / width
    return (_computed_pixels(width, tile.block_w) - width) / width


# (in channels, out channels, kernel taps) of the convs this kernel measured faster than cuDNN's (bf16), with the
# largest `wasted_fraction` of `launch_config`'s tile at which it was: 96 channels and the folded heads
# (`_FOLDED_TAPS`) at every measured width; 192 and 384 only where the programs tile the rows exactly or flat
# programs waste at most 1%. Everything else keeps cuDNN's conv. Measured on the H200 (docs/tuning.md sections
# 1.5, 1.7 and 1.15); it serves the cards `rewrite.kernels.cards` lists, others keep cuDNN's conv.
_FASTER_THAN_CUDNN: dict = {(96, 96, 27): math.inf, (192, 192, 27): 0.01, (384, 384, 27): 0.01, (192, 384, 27): 0.01,
                            (96, 3, 27): math.inf, (256, 12, 27): math.inf}


def norm_launch_config(in_channels: int, out_channels: int, width: Optional[int] = None,
                       flat: bool = True) -> ConvTile:
    """The tile of the fused norm epilogue (`conv3d_channels_last_norm_padded`): `launch_config`'s, capped at 128
    registers per thread so that two programs share an SM (docs/tuning.md section 1.6); flat tiles uncapped
    (section 1.15)."""
    tile = launch_config(in_channels, out_channels, width, flat=flat)
    return tile if tile.flat else tile._replace(max_registers=128)


# (in channels, out channels) of the convs whose fused norm epilogue measured faster than the conv with a raw
# output plus the norm kernel, with `norm_launch_config`'s tile (docs/tuning.md sections 1.6 and 1.7).
_NORM_EPILOGUE_FASTER: frozenset = frozenset({(96, 96), (192, 192)})


def norm_epilogue_chosen(in_channels: int, out_channels: int) -> bool:
    """Whether the Wan pair op fuses the next norm into this conv's epilogue (else conv, then the norm kernel)."""
    return (in_channels, out_channels) in _NORM_EPILOGUE_FASTER


# Per card: (in channels, out channels, kernel taps, output row width) of further convs that card's own sweep
# measured faster than cuDNN's with `card_launch_config`'s tile, at exactly that width (docs/tuning.md 1.21):
# the H100's encoder convs (Wan 2.1's 96 -> 192 at 720p and 480p; Wan 2.2's 160 -> 320 and 320 at 176x320 with
# one-program channel splits, docs/tuning.md 1.22, and 320 -> 640 and 640 at 88x160)
# and the encoder's first conv, its 3 video channels widened to 16 (`rewrite.models.wan.causal_conv_fast`): 27 taps,
# and its folded form (kernel columns in the channels, 9 taps; docs/tuning.md 1.22).
CARD_FASTER_THAN_CUDNN: dict[str, frozenset] = {
    "NVIDIA H100 80GB HBM3": frozenset({(96, 192, 27, 640), (96, 192, 27, 416), (320, 640, 27, 160),
                                       (640, 640, 27, 160), (16, 96, 27, 1280), (16, 96, 27, 832),
                                       (16, 96, 9, 1280), (16, 96, 9, 832), (160, 320, 27, 320),
                                       (320, 320, 27, 320)}),
}
# Per card: the same keys where that card measured cuDNN's conv faster than the shared table's choice: the H100's
# 192-channel convs 960 wide (1088x1920; a decode 0.9% faster with them on cuDNN, docs/tuning.md 1.21).
CARD_CUDNN_FASTER: dict[str, frozenset] = {"NVIDIA H100 80GB HBM3": frozenset({(192, 192, 27, 960)})}


def chosen(in_channels: int, out_channels: int, taps: int, width=None, device: Optional[torch.device] = None) -> bool:
    """Whether the Wan ``channels_last`` ops run this kernel (else cuDNN's conv) for the conv shape with output
    rows of `width` pixels on `device` (`_FASTER_THAN_CUDNN`, judged with the tile the kernel launches there,
    `card_launch_config`; and the card's own `CARD_FASTER_THAN_CUDNN` and `CARD_CUDNN_FASTER`). A width that is not a plain int (a
    symbolic graph's) is decided by the op at run time, on its tensors: here only the channels and taps count.
    No device: the tables' cards in general (the CPU under the interpreter, tests)."""
    card = None if device is None else cards.name(device)
    card_convs = CARD_FASTER_THAN_CUDNN.get(card, frozenset()) if card is not None else frozenset().union(
        *CARD_FASTER_THAN_CUDNN.values())
    if not isinstance(width, int):
        return ((in_channels, out_channels, taps) in _FASTER_THAN_CUDNN
                or any(conv[:3] == (in_channels, out_channels, taps) for conv in card_convs))
    if (in_channels, out_channels, taps, width) in card_convs:
        return True
    if card is not None and (in_channels, out_channels, taps, width) in CARD_CUDNN_FASTER.get(card, frozenset()):
        return False
    limit = _FASTER_THAN_CUDNN.get((in_channels, out_channels, taps))
    if limit is None:
        return False
    tile = (launch_config(in_channels, out_channels, width) if device is None or taps != 27
            else card_launch_config(in_channels, out_channels, width, 3, device))
    return wasted_fraction(tile, width) <= limit


def unsupported_reason(in_shape, weight_shape, dtype: torch.dtype) -> Optional[str]:
    """None when `conv3d_channels_last` serves a padded input of `in_shape` ([B, C, Tp, Hp, Wp]) and a
    weight of `weight_shape` ([O, C, kt, kh, kw]) in `dtype`, else why not (the caller keeps cuDNN's conv)."""
    if triton is None or TensorDescriptor is None:
        return "triton with tensor descriptors is not importable"
    if len(in_shape) != 5 or len(weight_shape) != 5 or in_shape[1] != weight_shape[1]:
        return f"expected [B, C, T, H, W] and [O, C, kt, kh, kw], got {tuple(in_shape)} and {tuple(weight_shape)}"
    if dtype not in SUPPORTED_DTYPES:
        return f"dtype {dtype} (the Triton conv3d serves {SUPPORTED_DTYPES}; fp32 keeps cuDNN's TF32 conv)"
    in_channels = weight_shape[1]
    if in_channels % 16:
        return f"{in_channels} input channels (a multiple of 16 is needed)"
    if any(s < k for s, k in zip(in_shape[2:], weight_shape[2:])):
        return f"input {tuple(in_shape[2:])} is smaller than the kernel {tuple(weight_shape[2:])}"
    return None


if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import dot as _dot
    from rewrite.kernels.aten_math import round_to as _round
    from rewrite.kernels.norm.one_pass import inverse_norm, normalized

    @triton.jit
    def _per_channel(ptr, n, C_OUT):
        """A per-channel vector (bias, deferred bias, gamma) at channels n as an fp32 row to broadcast."""
        return tl.load(ptr + n, mask=n < C_OUT, other=0.0).to(tl.float32)[None, :]

    @triton.jit
    def _offsets(w, n, s_w, s_n, WIDE: tl.constexpr):
        """The [BLOCK_W, BLOCK_N] in-row offsets of pixels w and channels n: int32 unless WIDE (an offset within
        one output row reaches 2^31); the row's own offset is one int64 scalar added to the base pointer. (int64
        tiles: 304 bytes of spills with a residual on sm_90, against 16.)"""
        if WIDE:
            return w.to(tl.int64)[:, None] * s_w + n.to(tl.int64)[None, :] * s_n
        else:
            return w[:, None] * s_w + n[None, :] * s_n

    @triton.jit
    def _epilogue(acc, n0, w, out_row, res_row, bias_ptr, rb_ptr, C_OUT, W_OUT, so1, so4, sr1, sr4,
                  HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_RES_BIAS: tl.constexpr,
                  BLOCK_N: tl.constexpr, WIDE: tl.constexpr):
        """Add bias / residual (+ its deferred bias) to the fp32 tile of channels n0.. and store it rounded once
        (`out_row` / `res_row`: the output / residual pointers advanced to the program's row; any strides)."""
        n = n0 + tl.arange(0, BLOCK_N)
        mask = (w < W_OUT)[:, None] & (n < C_OUT)[None, :]
        if HAS_BIAS:
            acc += _per_channel(bias_ptr, n, C_OUT)
        if HAS_RESIDUAL:
            r = tl.load(res_row + _offsets(w, n, sr4, sr1, WIDE), mask=mask, other=0.0).to(tl.float32)
            if HAS_RES_BIAS:
                r += _per_channel(rb_ptr, n, C_OUT)
            acc += r
        tl.store(out_row + _offsets(w, n, so4, so1, WIDE), _round(acc, out_row.dtype.element_ty), mask=mask)

    @triton.jit
    def _summed(acc, n0, b, t, h, w0, o_desc, r_desc, bias_ptr, rb_ptr, C_OUT, T_OUT, H_OUT, dtype: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_RES_BIAS: tl.constexpr, OUT_MODE: tl.constexpr,
                RES_MODE: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr):
        """The output of channels n0.. (conv + bias + residual (+ its deferred bias), rounded once to `dtype`),
        stored by TMA where OUT_MODE is not 0: the plain epilogue's output, or the NORM epilogue's where the conv's
        own output is read again (a residual block's output is the next block's shortcut)."""
        n = n0 + tl.arange(0, BLOCK_N)
        if HAS_BIAS:
            acc += _per_channel(bias_ptr, n, C_OUT)
        if HAS_RESIDUAL:
            r = _load_rows(r_desc, b, t, h, w0, n0, T_OUT, H_OUT, RES_MODE, BLOCK_W, BLOCK_N).to(tl.float32)
            if HAS_RES_BIAS:
                r += _per_channel(rb_ptr, n, C_OUT)
            acc += r
        y = _round(acc, dtype)
        if OUT_MODE != 0:
            _store_rows(o_desc, y, b, t, h, w0, n0, T_OUT, H_OUT, OUT_MODE, BLOCK_W, BLOCK_N)
        return y

    @triton.jit
    def _load_rows(desc, b, t, h, w0, n0, T, H, MODE: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr):
        """The [BLOCK_W pixels, BLOCK_N channels] tile at (b, t, h, w0.., n0..) of a tensor whose descriptor views
        it as [B*T*H, W, C] (MODE 1, channels-last), [B, C, T*H, W] (MODE 2, NCDHW) or [B*T, C, H, W] (MODE 3,
        frame-major: a per-frame conv's output); TMA zero-fills past W and C (each its own dimension)."""
        if MODE == 1:
            return tl.reshape(desc.load([(b * T + t) * H + h, w0, n0]), [BLOCK_W, BLOCK_N])
        elif MODE == 2:
            return tl.trans(tl.reshape(desc.load([b, n0, t * H + h, w0]), [BLOCK_N, BLOCK_W]))
        else:
            return tl.trans(tl.reshape(desc.load([b * T + t, n0, h, w0]), [BLOCK_N, BLOCK_W]))

    @triton.jit
    def _store_rows(desc, tile, b, t, h, w0, n0, T, H, MODE: tl.constexpr, BLOCK_W: tl.constexpr,
                    BLOCK_N: tl.constexpr):
        """`_load_rows`' tile stored (TMA clips it at the tensor's W and C)."""
        if MODE == 1:
            desc.store([(b * T + t) * H + h, w0, n0], tl.reshape(tile, [1, BLOCK_W, BLOCK_N]))
        elif MODE == 2:
            desc.store([b, n0, t * H + h, w0], tl.reshape(tl.trans(tile), [1, BLOCK_N, 1, BLOCK_W]))
        else:
            desc.store([b * T + t, n0, h, w0], tl.reshape(tl.trans(tile), [1, BLOCK_N, 1, BLOCK_W]))

    @triton.jit
    def _inverse_norm(squares, scale, eps):
        """`scale / max(sqrt(squares), eps)` per pixel, as a column to broadcast."""
        return inverse_norm(tl.sqrt(squares), scale, eps)[:, None]

    @triton.jit
    def _store_normalized(y, n0, inv_norm, w, pad_row, pad_col, cache_row, cache_col, IN_CACHE, pad_desc,
                          cache_desc, gamma_ptr, C_OUT, W_OUT, nbias, SILU: tl.constexpr, BLOCK_W: tl.constexpr,
                          BLOCK_N: tl.constexpr):
        """The Wan norm (+ SiLU) of the tile y (channels n0..; `inv_norm` = scale / its pixels' clamped channel
        norms) in fp32, rounded once, stored by TMA into the next conv's padded input row (0 past the row end:
        its right pad) and, IN_CACHE, the next cache's row (both channels-last)."""
        gamma = _per_channel(gamma_ptr, n0 + tl.arange(0, BLOCK_N), C_OUT)
        v = normalized(y.to(tl.float32), inv_norm, gamma, nbias, SILU)
        v = tl.reshape(_round(tl.where((w < W_OUT)[:, None], v, 0.0), y.dtype), [1, BLOCK_W, BLOCK_N])
        pad_desc.store([pad_row, pad_col, n0], v)
        if IN_CACHE:
            cache_desc.store([cache_row, cache_col, n0], v)

    @triton.jit
    def _row_epilogue(acc, acc2, b, t, h, w0, n0, o_desc, o2_desc, r_desc, r2_desc, n_desc, n2_desc, c_desc, c2_desc,
                      bias_ptr, res_ptr, rb_ptr, out_ptr, gamma_ptr, C_OUT, T_OUT, H_OUT, W_OUT, so0, so1, so2, so3,
                      so4, sr0, sr1, sr2, sr3, sr4, TO, HO, FT, PH, PW, SLOT0, scale, nbias, eps,
                      HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_RES_BIAS: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr,
                      OUT_MODE: tl.constexpr, RES_MODE: tl.constexpr, N_REST: tl.constexpr, WIDE: tl.constexpr,
                      BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr):
        """The epilogue of one output row (b, t, h) of a program: `acc` holds channels n0.. (BLOCK_N) of pixels
        w0.. (BLOCK_W) and, N_REST > 0, `acc2` channels BLOCK_N.. (N_REST) of the same pixels (the kernel's
        docstring says where they go)."""
        w = w0 + tl.arange(0, BLOCK_W)
        if NORM:
            dtype: tl.constexpr = n_desc.dtype
            pad_row = (b * TO + FT + t) * HO + PH + h
            slot = t - SLOT0
            cache_row = (b * 2 + slot) * H_OUT + h
            in_cache = (slot >= 0) & (slot < 2)
            if N_REST > 0:  # rounded at once (half the registers of the fp32 sums), stored N_REST channels at a time
                y2 = _summed(acc2, BLOCK_N, b, t, h, w0, o2_desc, r2_desc, bias_ptr, rb_ptr, C_OUT, T_OUT, H_OUT, dtype,
                             HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, OUT_MODE, RES_MODE, BLOCK_W, N_REST)
                y = _summed(acc, 0, b, t, h, w0, o_desc, r_desc, bias_ptr, rb_ptr, C_OUT, T_OUT, H_OUT, dtype,
                            HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, OUT_MODE, RES_MODE, BLOCK_W, BLOCK_N)
                squares = (tl.sum(y.to(tl.float32) * y.to(tl.float32), axis=1)
                           + tl.sum(y2.to(tl.float32) * y2.to(tl.float32), axis=1))
                inv_norm = _inverse_norm(squares, scale, eps)
                _store_normalized(y2, BLOCK_N, inv_norm, w, pad_row, PW + w0, cache_row, w0, in_cache, n2_desc,
                                  c2_desc, gamma_ptr, C_OUT, W_OUT, nbias, SILU, BLOCK_W, N_REST)
                ya, yb = tl.split(tl.permute(tl.reshape(y, [BLOCK_W, 2, N_REST]), [0, 2, 1]))
                _store_normalized(ya, 0, inv_norm, w, pad_row, PW + w0, cache_row, w0, in_cache, n2_desc, c2_desc,
                                  gamma_ptr, C_OUT, W_OUT, nbias, SILU, BLOCK_W, N_REST)
                _store_normalized(yb, N_REST, inv_norm, w, pad_row, PW + w0, cache_row, w0, in_cache, n2_desc,
                                  c2_desc, gamma_ptr, C_OUT, W_OUT, nbias, SILU, BLOCK_W, N_REST)
            else:
                y = _summed(acc, n0, b, t, h, w0, o_desc, r_desc, bias_ptr, rb_ptr, C_OUT, T_OUT, H_OUT, dtype,
                            HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, OUT_MODE, RES_MODE, BLOCK_W, BLOCK_N)
                inv_norm = _inverse_norm(tl.sum(y.to(tl.float32) * y.to(tl.float32), axis=1), scale, eps)
                _store_normalized(y, n0, inv_norm, w, pad_row, PW + w0, cache_row, w0, in_cache, n_desc, c_desc,
                                  gamma_ptr, C_OUT, W_OUT, nbias, SILU, BLOCK_W, BLOCK_N)
        elif OUT_MODE != 0:
            out_dtype: tl.constexpr = o_desc.dtype
            if N_REST > 0:  # the narrow accumulator first: fewer registers live while the residual tile is
                _summed(acc2, BLOCK_N, b, t, h, w0, o2_desc, r2_desc, bias_ptr, rb_ptr, C_OUT, T_OUT, H_OUT, out_dtype,
                        HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, OUT_MODE, RES_MODE, BLOCK_W, N_REST)
            _summed(acc, n0, b, t, h, w0, o_desc, r_desc, bias_ptr, rb_ptr, C_OUT, T_OUT, H_OUT, out_dtype, HAS_BIAS,
                    HAS_RESIDUAL, HAS_RES_BIAS, OUT_MODE, RES_MODE, BLOCK_W, BLOCK_N)
        else:
            b64 = b.to(tl.int64)
            t64 = t.to(tl.int64)
            h64 = h.to(tl.int64)
            out_row = out_ptr + (b64 * so0 + t64 * so2 + h64 * so3)
            res_row = res_ptr + (b64 * sr0 + t64 * sr2 + h64 * sr3)
            _epilogue(acc, n0, w, out_row, res_row, bias_ptr, rb_ptr, C_OUT, W_OUT, so1, so4, sr1, sr4, HAS_BIAS,
                      HAS_RESIDUAL, HAS_RES_BIAS, BLOCK_N, WIDE)
            if N_REST > 0:
                _epilogue(acc2, BLOCK_N, w, out_row, res_row, bias_ptr, rb_ptr, C_OUT, W_OUT, so1, so4, sr1, sr4,
                          HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, N_REST, WIDE)

    # ---- flat programs (FLAT): positions running on from one output row into the next ----
    @triton.jit
    def _pixels(h, w0, WP, H_OUT, W_OUT, s_h, s_w, WIDE: tl.constexpr, BLOCK_W: tl.constexpr):
        """(offsets, inside) of a flat program's BLOCK_W positions w0.. of rows laid out WP apart (those past WP
        are row h + 1's pixels w - WP) from row h's start, in a tensor of row stride s_h and pixel stride s_w;
        `inside` masks the positions that are output pixels. int32 offsets unless WIDE (an offset within two
        output rows reaches 2^31)."""
        q = w0 + tl.arange(0, BLOCK_W)
        below = (q >= WP).to(tl.int32)
        w = q - below * WP
        inside = (w < W_OUT) & (h + below < H_OUT)
        if WIDE:
            return below.to(tl.int64) * s_h + w.to(tl.int64) * s_w, inside
        else:
            return below * s_h + w * s_w, inside

    @triton.jit
    def _flat_summed(acc, n0, out_row, res_row, pix_o, pix_r, inside, bias_ptr, rb_ptr, C_OUT, so1, sr1,
                     dtype: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                     HAS_RES_BIAS: tl.constexpr, HAS_OUT: tl.constexpr, BLOCK_N: tl.constexpr, WIDE: tl.constexpr):
        """`_summed` for a flat program: the residual read and, HAS_OUT, the output stored by pointers at
        `pix_r` / `pix_o` (`_pixels`)."""
        n = n0 + tl.arange(0, BLOCK_N)
        mask = inside[:, None] & (n < C_OUT)[None, :]
        if HAS_BIAS:
            acc += _per_channel(bias_ptr, n, C_OUT)
        if HAS_RESIDUAL:
            r = tl.load(res_row + _offsets(pix_r, n, 1, sr1, WIDE), mask=mask, other=0.0).to(tl.float32)
            if HAS_RES_BIAS:
                r += _per_channel(rb_ptr, n, C_OUT)
            acc += r
        y = _round(acc, dtype)
        if HAS_OUT:
            tl.store(out_row + _offsets(pix_o, n, 1, so1, WIDE), y, mask=mask)
        return y

    @triton.jit
    def _flat_store_normalized(y, n0, inv_norm, inside, pad_row, pad_col, IN_CACHE, pad_desc, cache_base, pix_c,
                               gamma_ptr, C_OUT, nbias, SILU: tl.constexpr, BLOCK_W: tl.constexpr,
                               BLOCK_N: tl.constexpr):
        """`_store_normalized` for a flat program: one TMA store at (pad_row, pad_col) of the next padded input
        viewed with rows WP wide (0 at the positions that are no output pixels, `inside`: that buffer's pads)
        and, IN_CACHE, the next cache by pointers at `pix_c` from `cache_base` (`_pixels`)."""
        n = n0 + tl.arange(0, BLOCK_N)
        gamma = _per_channel(gamma_ptr, n, C_OUT)
        v = normalized(y.to(tl.float32), inv_norm, gamma, nbias, SILU)
        v = _round(tl.where(inside[:, None], v, 0.0), y.dtype)
        pad_desc.store([pad_row, pad_col, n0], tl.reshape(v, [1, BLOCK_W, BLOCK_N]))
        if IN_CACHE:
            tl.store(cache_base + pix_c[:, None] + n[None, :], v, mask=inside[:, None] & (n < C_OUT)[None, :])

    @triton.jit
    def _flat_epilogue(acc, acc2, b, t, h, w0, n0, n_desc, n2_desc, bias_ptr, res_ptr, rb_ptr, out_ptr, gamma_ptr,
                       cache_ptr, C_OUT, H_OUT, W_OUT, WP, so0, so1, so2, so3, so4, sr0, sr1, sr2, sr3, sr4, TO, FT,
                       PH, PW, SLOT0, scale, nbias, eps, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       HAS_RES_BIAS: tl.constexpr, NORM: tl.constexpr, SILU: tl.constexpr, HAS_OUT: tl.constexpr,
                       N_REST: tl.constexpr, WIDE: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr):
        """`_row_epilogue` for a flat program (positions w0.. of row h running on into row h + 1): the output,
        residual and next cache by pointers (`_pixels`), the normalized tile into the next padded input by one
        TMA store (`n_desc`: its rows are WP wide too, so the program's positions are consecutive there)."""
        b64 = b.to(tl.int64)
        t64 = t.to(tl.int64)
        h64 = h.to(tl.int64)
        out_row = out_ptr + (b64 * so0 + t64 * so2 + h64 * so3)
        res_row = res_ptr + (b64 * sr0 + t64 * sr2 + h64 * sr3)
        pix_o, inside = _pixels(h, w0, WP, H_OUT, W_OUT, so3, so4, WIDE, BLOCK_W)
        pix_r, _ = _pixels(h, w0, WP, H_OUT, W_OUT, sr3, sr4, WIDE, BLOCK_W)
        if NORM:
            dtype: tl.constexpr = n_desc.dtype
            slot = t - SLOT0
            in_cache = (slot >= 0) & (slot < 2)
            pad_row = b * TO + FT + t
            pad_col = (PH + h) * WP + PW + w0
            cache_base = cache_ptr + (b64 * 2 + slot) * H_OUT * W_OUT * C_OUT + h64 * W_OUT * C_OUT
            pix_c, _ = _pixels(h, w0, WP, H_OUT, W_OUT, W_OUT * C_OUT, C_OUT, False, BLOCK_W)
            if N_REST > 0:  # rounded at once (half the registers of the fp32 sums), stored N_REST channels at a time
                y2 = _flat_summed(acc2, BLOCK_N, out_row, res_row, pix_o, pix_r, inside, bias_ptr, rb_ptr, C_OUT, so1,
                                  sr1, dtype, HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, HAS_OUT, N_REST, WIDE)
                y = _flat_summed(acc, 0, out_row, res_row, pix_o, pix_r, inside, bias_ptr, rb_ptr, C_OUT, so1, sr1,
                                 dtype, HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, HAS_OUT, BLOCK_N, WIDE)
                squares = (tl.sum(y.to(tl.float32) * y.to(tl.float32), axis=1)
                           + tl.sum(y2.to(tl.float32) * y2.to(tl.float32), axis=1))
                inv_norm = _inverse_norm(squares, scale, eps)
                _flat_store_normalized(y2, BLOCK_N, inv_norm, inside, pad_row, pad_col, in_cache, n2_desc, cache_base,
                                       pix_c, gamma_ptr, C_OUT, nbias, SILU, BLOCK_W, N_REST)
                ya, yb = tl.split(tl.permute(tl.reshape(y, [BLOCK_W, 2, N_REST]), [0, 2, 1]))
                _flat_store_normalized(ya, 0, inv_norm, inside, pad_row, pad_col, in_cache, n2_desc, cache_base,
                                       pix_c, gamma_ptr, C_OUT, nbias, SILU, BLOCK_W, N_REST)
                _flat_store_normalized(yb, N_REST, inv_norm, inside, pad_row, pad_col, in_cache, n2_desc, cache_base,
                                       pix_c, gamma_ptr, C_OUT, nbias, SILU, BLOCK_W, N_REST)
            else:
                y = _flat_summed(acc, n0, out_row, res_row, pix_o, pix_r, inside, bias_ptr, rb_ptr, C_OUT, so1, sr1,
                                 dtype, HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, HAS_OUT, BLOCK_N, WIDE)
                inv_norm = _inverse_norm(tl.sum(y.to(tl.float32) * y.to(tl.float32), axis=1), scale, eps)
                _flat_store_normalized(y, n0, inv_norm, inside, pad_row, pad_col, in_cache, n_desc, cache_base, pix_c,
                                       gamma_ptr, C_OUT, nbias, SILU, BLOCK_W, BLOCK_N)
        else:
            out_dtype: tl.constexpr = out_ptr.dtype.element_ty
            _flat_summed(acc, n0, out_row, res_row, pix_o, pix_r, inside, bias_ptr, rb_ptr, C_OUT, so1, sr1, out_dtype,
                         HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, True, BLOCK_N, WIDE)
            if N_REST > 0:
                _flat_summed(acc2, BLOCK_N, out_row, res_row, pix_o, pix_r, inside, bias_ptr, rb_ptr, C_OUT, so1, sr1,
                             out_dtype, HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, True, N_REST, WIDE)

    @triton.jit
    def _row_dots(a_desc, a_row, c0, wt, wt2, acc, acc2, N_REST: tl.constexpr):
        """One K step of one output row: the [BLOCK_W, BLOCK_K] input tile at flat pixel `a_row` times the
        weight tiles, into both accumulators."""
        a = a_desc.load([a_row, c0])
        acc = _dot(a, wt.T, acc)
        if N_REST > 0:
            acc2 = _dot(a, wt2.T, acc2)
        return acc, acc2

    # A_OFFSET (the upsampler phases' input offset) is not specialized: one compiled kernel serves 0, 1 and the rest
    @triton.jit(do_not_specialize=["A_OFFSET"])
    def _conv3d_kernel(a_desc, w_desc, w2_desc, o_desc, o2_desc, r_desc, r2_desc, n_desc, n2_desc, c_desc, c2_desc,
                       bias_ptr, res_ptr, rb_ptr, out_ptr, gamma_ptr, cache_ptr, C_OUT, T_OUT, H_OUT, W_OUT, TP, HP,
                       WP, N_BLOCKS,
                       W_TILES, A_OFFSET, so0, so1, so2, so3, so4, sr0, sr1, sr2, sr3, sr4, TO, HO, FT, PH, PW, SLOT0,
                       scale, nbias, eps, C_IN: tl.constexpr, KT: tl.constexpr, KH: tl.constexpr, KW: tl.constexpr,
                       HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_RES_BIAS: tl.constexpr,
                       NORM: tl.constexpr, SILU: tl.constexpr, OUT_MODE: tl.constexpr, RES_MODE: tl.constexpr,
                       N_REST: tl.constexpr, ROWS: tl.constexpr, WIDE: tl.constexpr, BLOCK_W: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                       WARP_SPECIALIZE: tl.constexpr, FLAT: tl.constexpr):
        """One program: ROWS output rows (b, t, h..) of BLOCK_W pixels (w0..) by BLOCK_N channels (N_REST > 0:
        channels 0..BLOCK_N-1 and BLOCK_N..BLOCK_N+N_REST-1 in two accumulators; the *2 descriptors are the
        second's tiles). FLAT (ROWS 1): the program's BLOCK_W pixels are consecutive positions of the frame's
        output rows laid out WP (the padded input's width) apart, so a program may run past row h's end, over
        WP - W_OUT positions that are no output pixels, into row h + 1 (module docstring). Program ids: axis 0
        runs over the channel blocks fastest (the programs that read the same input pixels run together), then
        the pixel tiles (w fastest); axis 1 over the frames (b, t).
        Epilogues (`_row_epilogue`, per row): OUT_MODE 0 stores by pointers (any strides), 1 / 2 / 3 by TMA
        into a channels-last / NCDHW / frame-major output (`o_desc`, the residual by `r_desc` in RES_MODE's
        layout); NORM normalizes every output channel into the next conv's padded input and next cache
        (`n_desc`, `c_desc`; the output itself also stored by `o_desc` where OUT_MODE is not 0; module
        docstring)."""
        pid = tl.program_id(0)
        tile = pid // N_BLOCKS
        n0 = (pid % N_BLOCKS) * BLOCK_N
        if FLAT:
            p0 = tile * BLOCK_W
            h = p0 // WP
            w0 = p0 - h * WP
        else:
            h = (tile // W_TILES) * ROWS
            w0 = (tile % W_TILES) * BLOCK_W
        frame = tl.program_id(1)
        t = frame % T_OUT
        b = frame // T_OUT
        blocks: tl.constexpr = C_IN // BLOCK_K
        REST: tl.constexpr = N_REST if N_REST > 0 else 16  # the placeholder accumulator's width when unused
        acc = tl.zeros((BLOCK_W, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((BLOCK_W, REST), dtype=tl.float32)
        accb = tl.zeros((BLOCK_W, BLOCK_N), dtype=tl.float32)  # row h + 1 (ROWS == 2)
        acc2b = tl.zeros((BLOCK_W, REST), dtype=tl.float32)
        for step in tl.range(0, KT * KH * KW * blocks, num_stages=STAGES, warp_specialize=WARP_SPECIALIZE):
            tap = step // blocks
            c0 = (step % blocks) * BLOCK_K
            i = tap // (KH * KW)
            j = (tap // KW) % KH
            k = tap % KW
            wt = w_desc.load([n0, tap * C_IN + c0])
            wt2 = wt
            if N_REST > 0:
                wt2 = w2_desc.load([BLOCK_N, tap * C_IN + c0])
            a_row = ((b * TP + t + i) * HP + h + j) * WP + w0 + k + A_OFFSET
            acc, acc2 = _row_dots(a_desc, a_row, c0, wt, wt2, acc, acc2, N_REST)
            if ROWS == 2:
                accb, acc2b = _row_dots(a_desc, a_row + WP, c0, wt, wt2, accb, acc2b, N_REST)
        if FLAT:
            _flat_epilogue(acc, acc2, b, t, h, w0, n0, n_desc, n2_desc, bias_ptr, res_ptr, rb_ptr, out_ptr, gamma_ptr,
                           cache_ptr, C_OUT, H_OUT, W_OUT, WP, so0, so1, so2, so3, so4, sr0, sr1, sr2, sr3, sr4, TO, FT,
                           PH, PW, SLOT0, scale, nbias, eps, HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, NORM, SILU,
                           OUT_MODE != 0, N_REST, WIDE, BLOCK_W, BLOCK_N)
        else:
            _row_epilogue(acc, acc2, b, t, h, w0, n0, o_desc, o2_desc, r_desc, r2_desc, n_desc, n2_desc, c_desc, c2_desc,
                          bias_ptr, res_ptr, rb_ptr, out_ptr, gamma_ptr, C_OUT, T_OUT, H_OUT, W_OUT, so0, so1, so2, so3,
                          so4, sr0, sr1, sr2, sr3, sr4, TO, HO, FT, PH, PW, SLOT0, scale, nbias, eps, HAS_BIAS,
                          HAS_RESIDUAL, HAS_RES_BIAS, NORM, SILU, OUT_MODE, RES_MODE, N_REST, WIDE, BLOCK_W, BLOCK_N)
        if ROWS == 2:
            if h + 1 < H_OUT:  # an odd row count's last program holds one row
                _row_epilogue(accb, acc2b, b, t, h + 1, w0, n0, o_desc, o2_desc, r_desc, r2_desc, n_desc, n2_desc,
                              c_desc, c2_desc, bias_ptr, res_ptr, rb_ptr, out_ptr, gamma_ptr, C_OUT, T_OUT, H_OUT,
                              W_OUT, so0, so1, so2, so3, so4, sr0, sr1, sr2, sr3, sr4, TO, HO, FT, PH, PW, SLOT0,
                              scale, nbias, eps, HAS_BIAS, HAS_RESIDUAL, HAS_RES_BIAS, NORM, SILU, OUT_MODE, RES_MODE,
                              N_REST, WIDE, BLOCK_W, BLOCK_N)

def _checked_shapes(padded: Tensor, weight: Tensor, bias: Optional[Tensor]) -> tuple[int, ...]:
    """The unpadded conv's output shape [B, O, T, H, W] after the argument checks every launcher shares."""
    reason = unsupported_reason(padded.shape, weight.shape, padded.dtype)
    if reason is not None:
        raise ValueError(f"conv3d_channels_last: {reason}")
    cl = torch.channels_last_3d
    if not (padded.is_contiguous(memory_format=cl) and weight.is_contiguous(memory_format=cl)):
        raise ValueError("conv3d_channels_last: padded input and weight must be channels-last (NDHWC) contiguous")
    batch, _, tp, hp, wp = padded.shape
    out_channels, _, kt, kh, kw = weight.shape
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise ValueError(f"conv3d_channels_last: bias must be [{out_channels}], got {tuple(bias.shape)}")
    return batch, out_channels, tp - kt + 1, hp - kh + 1, wp - kw + 1


def _row_view(t: Tensor) -> Optional[tuple[Tensor, int]]:
    """(view, mode) of a [B, C, T, H, W] tensor for `_load_rows` / `_store_rows`: channels-last memory as
    [B*T*H, W, C] (mode 1), NCDHW as [B, C, T*H, W] (mode 2), frame-major (B, T, C, H, W memory) as
    [B*T, C, H, W] (mode 3): the channels a dimension of their own in each, so that a tile of channels past C
    is clipped rather than landing in the next frame's; None for other strides or rows TMA cannot address
    (16-byte aligned base and strides)."""
    b, c, frames, h, w = t.shape
    if t.is_contiguous(memory_format=torch.channels_last_3d):
        view, mode = t.permute(0, 2, 3, 4, 1).reshape(b * frames * h, w, c), 1
    elif t.is_contiguous():
        view, mode = t.reshape(b, c, frames * h, w), 2
    elif layout.frame_major(t):
        view, mode = t.transpose(1, 2).reshape(b * frames, c, h, w), 3
    else:
        return None
    size = t.element_size()
    if t.data_ptr() % 16 or any(s * size % 16 for s in view.stride()[:-1]):
        return None
    return view, mode


def row_view_reason(t: Tensor) -> Optional[str]:
    """None when the kernel reads or writes `t` ([B, C, T, H, W]) by TMA rows (`_row_view`), else why not (the
    NORM epilogue needs it for its output and residual)."""
    if t.dim() != 5 or _row_view(t) is None:
        return (f"a tensor of strides {tuple(t.stride())} (rows by TMA need channels-last, NCDHW or frame-major "
                f"memory, 16-byte aligned)")
    return None


def _rows_descriptor(view: Tensor, mode: int, block_w: int, block_n: int):
    return TensorDescriptor.from_tensor(view, [1, block_w, block_n] if mode == 1 else [1, block_n, 1, block_w])


def _row_offsets_wide(shape: tuple[int, ...], *strides: tuple[int, ...], flat: bool = False) -> bool:
    """Whether an offset within one output row (w, channel) of a tensor of these strides, or flat within two
    rows, reaches 2^31."""
    return any((shape[4] - 1) * abs(s[4]) + (shape[1] - 1) * abs(s[1]) + flat * abs(s[3]) >= 2 ** 31
               for s in strides)


def tile_reason(tile: ConvTile, out_channels: int, padded_width: Optional[int] = None) -> Optional[str]:
    """None when `tile` can compute a conv with `out_channels` outputs over a padded input `padded_width` wide,
    else why not."""
    if tile.rows not in range(1, MAX_ROWS + 1):
        return f"{tile.rows} rows per program (1 to {MAX_ROWS} are unrolled)"
    if tile.flat and (tile.rows != 1 or (padded_width is not None and tile.block_w > padded_width + 1)):
        return (f"a flat tile of {tile.rows} x {tile.block_w} pixels over rows {padded_width} wide (one row of at "
                f"most the padded width + 1: a program spans two output rows at most)")
    if tile.n_rest and (tile.block_n + tile.n_rest != out_channels or tile.n_rest & (tile.n_rest - 1)
                        or tile.n_rest < 16):
        return (f"a {tile.block_n} + {tile.n_rest} channel split (the second a power of two >= 16) for "
                f"{out_channels} output channels")
    return None


class NextInput(NamedTuple):
    """Where the NORM epilogue writes the next conv's padded input: its frames and rows, the padded frame of
    output frame 0, the top and left zero pad, and the first output frame that is also a next-cache frame."""

    frames: int
    rows: int
    first_frame: int
    pad_top: int
    pad_left: int
    first_cache_frame: int


class NormEpilogue(NamedTuple):
    """The NORM epilogue of one launch: the next block's RMS norm (+ SiLU) of the conv output, stored into the
    next conv's padded input and cache (in the kernel's argument order)."""

    gamma: Tensor
    next_padded: Tensor
    next_cache: Tensor
    geometry: NextInput
    scale: float
    bias: float
    eps: float
    silu: bool


def _launch(padded: Tensor, weight: Tensor, tile: ConvTile, shape: tuple[int, ...], bias: Optional[Tensor],
            out: Optional[Tensor], residual: Optional[Tensor], residual_bias: Optional[Tensor],
            norm: Optional[NormEpilogue] = None, a_offset: int = 0) -> None:
    """One `_conv3d_kernel` launch; with `norm`, the NORM epilogue, `out` then the conv's own output or None (not
    stored). `a_offset`: the input pixel of output pixel 0 and tap 0, as a flat pixel index into `padded` (0: its
    first pixel)."""
    batch, channels, tp, hp, wp = padded.shape
    out_channels, _, kt, kh, kw = weight.shape
    reason = tile_reason(tile, out_channels, wp)
    if reason is not None:
        raise ValueError(f"conv3d_channels_last: {reason}")
    a2d = padded.permute(0, 2, 3, 4, 1).reshape(batch * tp * hp * wp, channels)  # views of NDHWC memory
    w2d = weight.permute(0, 2, 3, 4, 1).reshape(out_channels, kt * kh * kw * channels)
    a_desc = TensorDescriptor.from_tensor(a2d, [tile.block_w, tile.block_k])
    w_desc = TensorDescriptor.from_tensor(w2d, [tile.block_n, tile.block_k])
    w2_desc = TensorDescriptor.from_tensor(w2d, [tile.n_rest, tile.block_k]) if tile.n_rest else w_desc
    n_blocks = 1 if tile.n_rest else triton.cdiv(out_channels, tile.block_n)
    if tile.flat:  # pixel tiles over the output rows laid out wp apart (the kernel's FLAT)
        w_tiles = triton.cdiv(shape[3] * wp, tile.block_w)
        grid = (n_blocks * w_tiles, batch * shape[2])
    else:
        w_tiles = triton.cdiv(shape[4], tile.block_w)
        grid = (n_blocks * w_tiles * triton.cdiv(shape[3], tile.rows), batch * shape[2])
    blocks = (tile.block_n, tile.n_rest or tile.block_n)
    descriptors = [a_desc] * 8  # o, o2, r, r2, n, n2, c, c2: placeholders where the epilogue uses none
    out_mode = res_mode = 0
    out_rows = None if out is None or tile.flat else _row_view(out)
    res_rows = None if residual is None or tile.flat else _row_view(residual)
    next_cache = None
    if norm is None:
        gamma, geometry, scale, norm_bias, eps, silu = out, (0,) * 6, 1.0, 0.0, 0.0, False
        tma = out_rows is not None and (residual is None or res_rows is not None)
    elif tile.flat:  # output, residual and cache by pointers (`_flat_epilogue`); the padded input as rows wp wide
        gamma, next_padded, next_cache, geometry, scale, norm_bias, eps, silu = norm
        nb, nc, nt, nh, nw = next_padded.shape
        if nw != wp:
            raise ValueError(f"conv3d_channels_last_norm_padded: a flat tile needs the next padded input as wide as "
                             f"this one ({nw} against {wp})")
        tma = False
        out_mode = 4 if out is not None else 0  # the kernel's HAS_OUT
        flat_rows = next_padded.permute(0, 2, 3, 4, 1).reshape(nb * nt, nh * nw, nc)
        descriptors[4:6] = [TensorDescriptor.from_tensor(flat_rows, [1, tile.block_w, n]) for n in blocks]
    else:  # the next conv's buffers are channels-last (the caller checked): mode 1 rows
        gamma, next_padded, next_cache, geometry, scale, norm_bias, eps, silu = norm
        if (out is not None and out_rows is None) or (residual is not None and res_rows is None):
            raise ValueError("conv3d_channels_last_norm_padded: the output and residual must be rows TMA can address "
                             "(channels-last, NCDHW or frame-major, 16-byte aligned)")
        tma = True
        descriptors[4:6] = [_rows_descriptor(*_row_view(next_padded), tile.block_w, n) for n in blocks]
        descriptors[6:8] = [_rows_descriptor(*_row_view(next_cache), tile.block_w, n) for n in blocks]
    # per-element pointers (the norm-free epilogue's mode 0, flat programs): int64 offsets where needed
    wide = not tma and _row_offsets_wide(shape, *[t.stride() for t in (out, residual) if t is not None],
                                         flat=tile.flat)
    if tma and out_rows is not None:
        out_mode = out_rows[1]
        descriptors[0:2] = [_rows_descriptor(*out_rows, tile.block_w, n) for n in blocks]
    if tma and res_rows is not None:
        res_mode = res_rows[1]
        descriptors[2:4] = [_rows_descriptor(*res_rows, tile.block_w, n) for n in blocks]
    base = out if out is not None else padded  # pointer placeholders where nothing is read or written
    res = residual if residual is not None else base
    launch(_conv3d_kernel, grid, a_desc, w_desc, w2_desc, *descriptors, bias if bias is not None else base, res,
           residual_bias if residual_bias is not None else base, base, gamma,
           next_cache if next_cache is not None else base, out_channels, shape[2], shape[3], shape[4], tp, hp, wp,
           n_blocks, w_tiles, a_offset, *base.stride(), *res.stride(), *geometry, float(scale), float(norm_bias),
           float(eps), C_IN=channels, KT=kt, KH=kh, KW=kw, HAS_BIAS=bias is not None,
           HAS_RESIDUAL=residual is not None, HAS_RES_BIAS=residual_bias is not None, NORM=norm is not None,
           SILU=silu, OUT_MODE=out_mode, RES_MODE=res_mode, N_REST=tile.n_rest, ROWS=tile.rows, WIDE=wide,
           BLOCK_W=tile.block_w, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, STAGES=tile.stages,
           WARP_SPECIALIZE=tile.warp_specialize, FLAT=tile.flat, num_warps=tile.warps, exact=False,
           **({"maxnreg": tile.max_registers} if tile.max_registers and not INTERPRETING else {}))


def conv3d_channels_last(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                         out: Tensor, residual_bias: Optional[Tensor] = None,
                         config: Optional[ConvTile] = None) -> Tensor:
    """``conv3d(padded, weight, bias) (+ residual (+ residual_bias))`` into `out` (any strides, shape
    [B, O, T, H, W] of the unpadded conv; the activation dtype, or float32 for the unrounded fp32 sums) by the
    kernel of the module docstring; returns `out`. `padded` and
    `weight` must be channels-last (NDHWC) and contiguous in that order; `config` overrides the tile
    (`card_launch_config`'s)."""
    shape = _checked_shapes(padded, weight, bias)
    out_channels = shape[1]
    if tuple(out.shape) != shape or out.dtype not in (padded.dtype, torch.float32):
        raise ValueError(f"conv3d_channels_last: out must be {shape} {padded.dtype} (or float32: the fp32 sums), got "
                         f"{tuple(out.shape)} {out.dtype}")
    if residual_bias is not None and tuple(residual_bias.shape) != (out_channels,):
        raise ValueError(f"conv3d_channels_last: residual_bias must be [{out_channels}], got {tuple(residual_bias.shape)}")
    if residual is not None and tuple(residual.shape) != shape:
        raise ValueError(f"conv3d_channels_last: residual must be {shape}, got {tuple(residual.shape)}")
    if out.numel() == 0:
        return out
    tile = config or card_launch_config(padded.shape[1], out_channels, shape[4], weight.shape[4], padded.device)
    _launch(padded, weight, tile, shape, bias, out, residual, residual_bias)
    return out


# (in channels, out channels, kernel taps) of the narrow convs (fewer than MIN_OUT_CHANNELS outputs) that run as
# `conv3d_channels_last_folded`, and how many trailing kernel dims it folds into the output channels: the
# fastest folding of each head conv against the plain kernel and cuDNN (docs/tuning.md section 1.10).
_FOLDED_TAPS: dict = {(96, 3, 27): 2, (256, 12, 27): 2}


def folded_taps(in_channels: int, out_channels: int, taps: int) -> int:
    """The trailing kernel dims `conv3d_channels_last_folded` folds for this conv (`_FOLDED_TAPS`), 0: not folded."""
    return _FOLDED_TAPS.get((in_channels, out_channels, taps), 0)


def conv3d_channels_last_folded(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                                out: Tensor, residual_bias: Optional[Tensor] = None, fold: int = 1,
                                config: Optional[ConvTile] = None) -> Tensor:
    """`conv3d_channels_last` of a conv with few output channels (a decoder's head: 96 -> 3), computed with the
    last `fold` kernel dims (1: kw; 2: kh and kw) folded into the output channels: the kernel convolves
    `padded` with the weight ``[kh*kw*O, C, kt, 1, 1]`` (fold 2) into fp32 partial sums over every padded
    position, and the partial sums of tap (j, k) are added at their offsets, ``out[.., h, w] = sum_{j,k}
    partial[.., (j*kw + k)*O + o, h + j, w + k]`` (one strided ATen sum), then bias and residual, rounded once.
    Why: each input tile the kernel loads then serves kh*kw taps, where the plain kernel reloads it per tap
    from L2 for a 16-channel tile of which 3 are used (docs/tuning.md section 1.10). Returns `out`.
    Tolerance: the fp32 sum runs in another order (partial sums over C and kt, then the taps); one rounding."""
    shape = _checked_shapes(padded, weight, bias)
    batch, out_channels, frames, rows, columns = shape
    if fold not in (1, 2):
        raise ValueError(f"conv3d_channels_last_folded: fold {fold} (1: kw, 2: kh and kw)")
    if tuple(out.shape) != shape or out.dtype != padded.dtype:
        raise ValueError(f"conv3d_channels_last_folded: out must be {shape} {padded.dtype}, got {tuple(out.shape)} "
                         f"{out.dtype}")
    for name, t, expected in (("residual", residual, shape), ("residual_bias", residual_bias, (out_channels,))):
        if t is not None and tuple(t.shape) != expected:
            raise ValueError(f"conv3d_channels_last_folded: {name} must be {expected}, got {tuple(t.shape)}")
    if out.numel() == 0:
        return out
    _, channels, _, hp, wp = padded.shape
    _, _, kt, kh, kw = weight.shape
    spans = (kh, kw)[2 - fold:]  # the folded kernel dims
    taps = math.prod(spans)
    # folded[(j * kw + k) * O + o, c, i, 0, 0] = weight[o, c, i, j, k] (fold 2); folded[k * O + o, c, i, j, 0] (fold 1)
    if fold == 2:
        folded = weight.permute(3, 4, 0, 1, 2).reshape(taps * out_channels, channels, kt, 1, 1)
    else:
        folded = weight.permute(4, 0, 1, 2, 3).reshape(taps * out_channels, channels, kt, kh, 1)
    folded = folded.contiguous(memory_format=torch.channels_last_3d)
    partial_shape = (batch, taps * out_channels, frames, hp if fold == 2 else rows, wp)
    partial = torch.empty(partial_shape, dtype=torch.float32, device=padded.device)
    conv3d_channels_last(padded, folded, None, None, partial, config=config)
    # summed[b, o, t, h, w, (j,) k] = partial[b, (j * kw + k) * O + o, t, h + j, w + k]: one strided view, one sum
    sb, sc, st, sh, sw = partial.stride()
    tap_strides = ((kw * out_channels * sc + sh, out_channels * sc + sw) if fold == 2 else (out_channels * sc + sw,))
    taps_view = partial.as_strided((batch, out_channels, frames, rows, columns, *spans),
                                   (sb, sc, st, sh, sw, *tap_strides))
    total = taps_view.sum(dim=tuple(range(5, 5 + fold)))
    if bias is not None:
        total += bias.float().view(-1, 1, 1, 1)
    if residual is not None:
        total += residual.float()
        if residual_bias is not None:
            total += residual_bias.float().view(-1, 1, 1, 1)
    out.copy_(total)
    return out


# Per output channel count, the program shape (pixels, block_n, n_rest, warps, stages) of the upsampler's phase
# convs (their K loop is 4 taps long: smaller programs, two per SM, overlap one's epilogue with another's loop).
# Each beat the 27-tap conv's tile for these phase convs (docs/tuning.md section 1.11).
_PHASE_TILES = {96: (128, 64, 32, 4, 4), 192: (128, 128, 64, 4, 3)}


def phase_launch_config(in_channels: int, out_channels: int, width: Optional[int] = None) -> ConvTile:
    """The tile of `upsample2x_conv2d_channels_last`'s phase convs (`_PHASE_TILES`, arranged by `pixel_tile`
    over source rows of `width` pixels; other channel counts: `launch_config`'s)."""
    if out_channels not in _PHASE_TILES:
        return launch_config(in_channels, out_channels, width, flat=False)  # the phases: 1 x 2 x 2 kernels
    pixels, block_n, n_rest, warps, stages = _PHASE_TILES[out_channels]
    rows, block_w = pixel_tile(width, pixels)
    return ConvTile(block_w, block_n, _block_k(in_channels), warps, stages, n_rest, rows)


def upsample2x_conv2d_channels_last(padded_source: Tensor, weight: Tensor, bias: Optional[Tensor],
                                    out: Tensor, config: Optional[ConvTile] = None) -> Tensor:
    """``conv2d(upsample_nearest2x(source), weight, bias, padding=1)`` into `out` ([N, O, 2H, 2W], any strides)
    without the upsampled tensor: each output phase ``(ph, pw)`` (every other row and column) is a 2x2 conv of
    the source with `triton_phase_weights.phase_weights`, 4/9 of the upsampled conv's products, one launch per phase
    into that phase's strided view of `out` (bias added before the one rounding). `padded_source`: the source
    [N, C, H + 2, W + 2] with a zero border of one pixel, channels-last (NHWC) and contiguous; `weight`
    [O, C, 3, 3]. Returns `out`.
    Tolerance: the phase kernels' taps are sums of up to four weights rounded once to the weight dtype (about
    one weight ulp each), the conv's fp32 sum runs in another order than cuDNN's, one rounding."""
    if padded_source.dim() != 4 or weight.dim() != 4 or tuple(weight.shape[2:]) != (3, 3):
        raise ValueError(f"upsample2x_conv2d_channels_last: expected a [N, C, H+2, W+2] source and a [O, C, 3, 3] "
                         f"weight, got {tuple(padded_source.shape)} and {tuple(weight.shape)}")
    if not padded_source.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("upsample2x_conv2d_channels_last: the padded source must be channels-last (NHWC) contiguous")
    n, _, hp, wp = padded_source.shape
    out_channels = weight.shape[0]
    rows, columns = hp - 2, wp - 2
    expected = (n, out_channels, 2 * rows, 2 * columns)
    if tuple(out.shape) != expected or out.dtype != padded_source.dtype:
        raise ValueError(f"upsample2x_conv2d_channels_last: out must be {expected} {padded_source.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    # [O, C, 1, 2, 2] each: 1-frame 3-D kernels, phase 2 * ph + pw
    phases = [p.contiguous(memory_format=torch.channels_last_3d)  # views: phase_weights' memory is channels-last
              for p in triton_phase_weights.phase_weights(weight).unsqueeze(3)]
    source = padded_source.unsqueeze(2)  # [N, C, 1, H + 2, W + 2]: channels-last 3-D memory
    _checked_shapes(source, phases[0], bias)
    if out.numel() == 0:
        return out
    shape = (n, out_channels, 1, rows, columns)
    tile = config or phase_launch_config(weight.shape[1], out_channels, columns)
    for ph in (0, 1):
        for pw in (0, 1):
            _launch(source, phases[2 * ph + pw], tile, shape, bias, out[:, :, ph::2, pw::2].unsqueeze(2), None, None,
                    a_offset=ph * wp + pw)
    return out


def norm_epilogue_reason(out_channels: int, tile: ConvTile) -> Optional[str]:
    """None when one program of `tile` holds every output channel in pieces the NORM epilogue stores (one
    channel block, or a ``2n + n`` split stored as three n-channel pieces), else why not."""
    if tile.n_rest and tile.block_n != 2 * tile.n_rest:
        return f"a {tile.block_n} + {tile.n_rest} channel split (the epilogue stores three {tile.n_rest}-channel pieces)"
    if tile.n_rest or tile.block_n >= out_channels:
        return None
    return f"{out_channels} output channels span several programs of a {tile.block_n}-channel tile"


def conv3d_channels_last_norm_padded(padded: Tensor, weight: Tensor, bias: Optional[Tensor], gamma: Tensor,
                                     scale: float, norm_bias: float, eps: float, silu: bool,
                                     next_padded: Tensor, next_cache: Tensor, pad: list[int], cache_frames: int,
                                     config: Optional[ConvTile] = None, residual: Optional[Tensor] = None,
                                     residual_bias: Optional[Tensor] = None, out: Optional[Tensor] = None) -> None:
    """``y = conv3d(padded, weight, bias) (+ residual (+ residual_bias))`` rounded once, then the Wan RMS norm
    of y over its channels, ``y / max(||y||, eps) * scale * gamma + norm_bias`` (SiLU if `silu`), stored
    straight into the next causal conv's padded input `next_padded` (frame t at frame
    ``pad[4] + cache_frames + t``, pixel (h, w) at ``(pad[2] + h, pad[0] + w)``) and y's last two frames also
    into `next_cache` ([B, O, 2, H, W]; for a 1-frame y, slot 1): the positions
    `triton_norm.rms_norm_padded_channels_last` stores of an x equal to y. Both buffers channels-last, as
    `triton_pad.causal_pad_rest_channels_last` allocates them (it writes their other positions). With `out`
    ([B, O, T, H, W], rows TMA can address: channels-last, NCDHW or frame-major) y itself is stored there too
    (a residual block's output, which the next block reads again as its shortcut); `residual` must be such
    rows too. Tolerance: the norm runs in fp32 from y (squares summed in the tile's order, a multiply by the
    reciprocal norm, Triton's sigmoid) and rounds once, where ATen rounds after each op."""
    shape = _checked_shapes(padded, weight, bias)
    batch, out_channels, frames, rows, columns = shape
    # flat programs store the padded input as rows as wide as this conv's (the next conv's padding matches)
    tile = config or norm_launch_config(padded.shape[1], out_channels, columns,
                                        flat=next_padded.shape[4] == padded.shape[4])
    reason = norm_epilogue_reason(out_channels, tile)
    if reason is not None:
        raise ValueError(f"conv3d_channels_last_norm_padded: {reason}")
    cl = torch.channels_last_3d
    wl, _, hl, _, tl_, _ = pad
    geometry = NextInput(next_padded.shape[2], next_padded.shape[3], tl_ + cache_frames, hl, wl, frames - 2)
    expected_cache = (batch, out_channels, 2, rows, columns)
    if (next_padded.shape[:2] != shape[:2] or geometry.first_frame + frames > geometry.frames or hl + rows > geometry.rows
            or wl + columns > next_padded.shape[4] or tuple(next_cache.shape) != expected_cache
            or not (next_padded.is_contiguous(memory_format=cl) and next_cache.is_contiguous(memory_format=cl))
            or next_padded.dtype != padded.dtype or next_cache.dtype != padded.dtype):
        raise ValueError(f"conv3d_channels_last_norm_padded: next padded input {tuple(next_padded.shape)} / next "
                         f"cache {tuple(next_cache.shape)} (channels-last, {padded.dtype}) do not hold a {shape} "
                         f"output padded by {pad} after {cache_frames} cache frames")
    if out_channels % 8:
        raise ValueError(f"conv3d_channels_last_norm_padded: {out_channels} output channels (the next input's "
                         f"channels-last rows are stored by TMA: a multiple of 8 is needed)")
    if gamma.numel() != out_channels:
        raise ValueError(f"conv3d_channels_last_norm_padded: gamma must have {out_channels} values, got {gamma.numel()}")
    for name, t in (("out", out), ("residual", residual)):
        if t is not None and (tuple(t.shape) != shape or t.dtype != padded.dtype):
            raise ValueError(f"conv3d_channels_last_norm_padded: {name} must be {shape} {padded.dtype}, got "
                             f"{tuple(t.shape)} {t.dtype}")
    if residual_bias is not None and (residual is None or tuple(residual_bias.shape) != (out_channels,)):
        raise ValueError(f"conv3d_channels_last_norm_padded: residual_bias must be [{out_channels}] with a residual")
    if batch * frames * rows * columns == 0:
        return
    _launch(padded, weight, tile, shape, bias, out, residual, residual_bias,
            norm=NormEpilogue(gamma, next_padded, next_cache, geometry, scale, norm_bias, eps, silu))
