"""The Triton conv3d kernel of level ``channels_last``: against the conv in float64 (CPU under the interpreter, and
the Wan shape classes on the GPU), its epilogue layouts, row and flat program tiles, and the shapes and tiles it
declines with their reasons.

Tolerance: bf16/fp16 products are exact in fp32 and the kernel rounds its fp32 sum (bias and residual
included) once, so its output is within half an output ulp of its fp32 sum, which is within n * 2**-24 *
sum|terms| of the exact value (n terms, the standard recursive-summation bound). The check allows one ulp of
the output dtype (at the larger of the two values) plus that bound.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.ops.dispatch import INTERPRETING
from rewrite.kernels.conv3d.conv3d import ConvTile
from tests import quick
from tests.op_cases import channels_last, frame_major
from tests.ulps import within_one_ulp

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")
CL = torch.channels_last_3d
SMALL = ConvTile(32, 32, 16, 4, 2)  # small tiles keep the interpreter fast


def _operands(b, c, o, t, h, w, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    padded = torch.randn(b, c, t + 2, h + 2, w + 2, generator=g).to(dtype).to(DEVICE).contiguous(memory_format=CL)
    weight = (torch.randn(o, c, 3, 3, 3, generator=g) / (27 * c) ** 0.5).to(dtype).to(DEVICE).contiguous(memory_format=CL)
    bias = torch.randn(o, generator=g).to(dtype).to(DEVICE)
    residual = torch.randn(b, o, t, h, w, generator=g).to(dtype).to(DEVICE)
    return padded, weight, bias, residual


@needs_kernels
@pytest.mark.parametrize("b,c,o,t,h,w,tile,dtype", quick.product({f"{b}-{c}-{o}-{t}-{h}-{w}-tile{i}": (b, c, o, t, h, w, tile)
                                                           for i, (b, c, o, t, h, w, tile) in enumerate([
    (1, 16, 16, 1, 3, 37, SMALL),                              # width not a multiple of the block
    (2, 32, 48, 3, 2, 9, SMALL),                               # 48 outputs: a partial channel block
    (1, 48, 24, 2, 3, 20, ConvTile(32, 32, 16, 4, 2)),         # K = 3 blocks of 16 channels
    (1, 32, 96, 1, 2, 40, ConvTile(32, 64, 32, 4, 2, 32)),     # the 64 + 32 split of 96 channels
    (1, 16, 80, 1, 2, 12, ConvTile(16, 64, 16, 4, 2, 16)),     # a 4 + 1 split (80 = 64 + 16), as 160 = 128 + 32
    (1, 16, 48, 2, 5, 20, ConvTile(16, 32, 16, 4, 2, 16, 2)),  # two rows per program (an odd row count), 32 + 16
    (2, 32, 40, 1, 4, 12, ConvTile(16, 32, 32, 4, 2, 0, 2)),   # two rows, a partial channel block, 2 batches
    (1, 32, 3, 2, 3, 24, ConvTile(32, 16, 32, 4, 2)),          # 3 outputs (Wan's head) in a 16-channel tile
])}, {"bf16": (torch.bfloat16,), "fp16": (torch.float16,)}))
def test_kernel_matches_the_conv(b, c, o, t, h, w, tile, dtype):
    padded, weight, bias, residual = _operands(b, c, o, t, h, w, dtype)
    residual_bias = bias.flip(0)
    reference = (F.conv3d(padded.double(), weight.double(), bias.double()) + residual.double()
                 + residual_bias.double().view(-1, 1, 1, 1))
    plain_magnitude = F.conv3d(padded.double().abs(), weight.double().abs())
    magnitude = (plain_magnitude + bias.double().abs().view(-1, 1, 1, 1) + residual.double().abs()
                 + residual_bias.double().abs().view(-1, 1, 1, 1))
    terms = 27 * c + 3
    for out in (torch.empty(reference.shape, dtype=dtype, device=DEVICE),
                torch.empty(reference.shape, dtype=dtype, device=DEVICE).contiguous(memory_format=CL)):
        triton_conv3d.conv3d_channels_last(padded, weight, bias, residual.contiguous(memory_format=CL), out,
                                           residual_bias, config=tile)
        within_one_ulp(out, reference, magnitude, terms)
    plain = torch.empty(reference.shape, dtype=dtype, device=DEVICE)
    triton_conv3d.conv3d_channels_last(padded, weight, None, None, plain, config=tile)
    within_one_ulp(plain, F.conv3d(padded.double(), weight.double()), plain_magnitude, terms)


@needs_kernels
@pytest.mark.parametrize("fold", [1, 2])
@pytest.mark.parametrize("c,o,t,h,w", [(32, 3, 2, 3, 20), (16, 5, 1, 4, 13)])  # a head's 3 outputs; odd sizes
def test_folded_kernel_matches_the_conv(fold, c, o, t, h, w):
    """The narrow conv with its kernel taps folded into the output channels: fp32 partial sums (the same
    products, summed in another order) and one rounding, so the kernel test's bound holds."""
    padded, weight, bias, residual = _operands(1, c, o, t, h, w, torch.bfloat16, seed=3)
    residual_bias = bias.flip(0)
    reference = (F.conv3d(padded.double(), weight.double(), bias.double()) + residual.double()
                 + residual_bias.double().view(-1, 1, 1, 1))
    magnitude = (F.conv3d(padded.double().abs(), weight.double().abs()) + bias.double().abs().view(-1, 1, 1, 1)
                 + residual.double().abs() + residual_bias.double().abs().view(-1, 1, 1, 1))
    out = torch.empty(reference.shape, dtype=torch.bfloat16, device=DEVICE)
    triton_conv3d.conv3d_channels_last_folded(padded, weight, bias, residual, out, residual_bias, fold=fold,
                                              config=ConvTile(32, 32, 16, 4, 2))
    within_one_ulp(out, reference, magnitude, 27 * c + 3)


def test_folded_kernel_rejects_bad_operands():
    padded, weight, bias, residual = _operands(1, 16, 3, 1, 2, 4, torch.bfloat16)
    out = torch.empty(1, 3, 1, 2, 4, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="fold 3"):
        triton_conv3d.conv3d_channels_last_folded(padded, weight, bias, None, out, fold=3)
    with pytest.raises(ValueError, match="out must be"):
        triton_conv3d.conv3d_channels_last_folded(padded, weight, bias, None, out.float(), fold=1)
    with pytest.raises(ValueError, match="residual must be"):
        triton_conv3d.conv3d_channels_last_folded(padded, weight, bias, residual[:, :, :, :1], out, fold=1)


EPILOGUE_LAYOUTS = {"ncdhw": lambda t: t.contiguous(), "channels_last": channels_last, "frame_major": frame_major,
                    # w outermost: no row of w is contiguous, so the epilogue addresses elements by pointers
                    "channels_first_w": lambda t: t.permute(4, 0, 1, 2, 3).contiguous().permute(1, 2, 3, 4, 0)}


@needs_kernels
@pytest.mark.parametrize("out_layout,res_layout,expected_mode", [
    ("ncdhw", "ncdhw", 2), ("channels_last", "channels_last", 1), ("ncdhw", "channels_last", 2),
    ("channels_last", "ncdhw", 1),                       # TMA output, the residual read in its own layout
    # frame-major (a per-frame conv's output) by TMA too; a layout without contiguous rows: pointers
    ("frame_major", "ncdhw", 3), ("ncdhw", "frame_major", 2), ("ncdhw", "channels_first_w", 0),
])
@pytest.mark.parametrize("width", [40, 38])              # 38: NCDHW rows not 16-byte aligned -> pointers
def test_kernel_epilogue_layouts(out_layout, res_layout, expected_mode, width):
    """Every epilogue (TMA rows of either layout, per-element pointers) gives the conv within the module's
    bound, and the router picks TMA exactly where the rows are addressable."""
    padded, weight, bias, residual = _operands(1, 16, 16, 2, 3, width, torch.bfloat16, seed=5)
    reference = F.conv3d(padded.double(), weight.double(), bias.double()) + residual.double()
    magnitude = (F.conv3d(padded.double().abs(), weight.double().abs()) + bias.double().abs().view(-1, 1, 1, 1)
                 + residual.double().abs())
    out = EPILOGUE_LAYOUTS[out_layout](torch.empty(reference.shape, dtype=torch.bfloat16, device=DEVICE))
    res = EPILOGUE_LAYOUTS[res_layout](residual)
    rows = [triton_conv3d._row_view(t) for t in (out, res)]
    mode = rows[0][1] if all(r is not None for r in rows) else 0
    unaligned = width == 38 and {"ncdhw", "frame_major"} & {out_layout, res_layout}
    assert mode == (0 if unaligned else expected_mode)
    triton_conv3d.conv3d_channels_last(padded, weight, bias, res, out, config=SMALL)
    within_one_ulp(out, reference, magnitude, 27 * 16 + 2)


@needs_kernels
@pytest.mark.parametrize("out_layout,res_layout", [("channels_last", "ncdhw"), ("ncdhw", "frame_major"),
                                                   ("frame_major", "channels_last"), ("ncdhw", "channels_first_w")])
def test_two_row_programs_in_every_epilogue(out_layout, res_layout):
    """Programs of two output rows (the second skipped past an odd row count) and a 16 + 16 channel split
    store every row through each epilogue within the module's bound."""
    padded, weight, bias, residual = _operands(1, 16, 32, 2, 3, 24, torch.bfloat16, seed=7)
    reference = F.conv3d(padded.double(), weight.double(), bias.double()) + residual.double()
    magnitude = (F.conv3d(padded.double().abs(), weight.double().abs()) + bias.double().abs().view(-1, 1, 1, 1)
                 + residual.double().abs())
    out = EPILOGUE_LAYOUTS[out_layout](torch.zeros(reference.shape, dtype=torch.bfloat16, device=DEVICE))
    triton_conv3d.conv3d_channels_last(padded, weight, bias, EPILOGUE_LAYOUTS[res_layout](residual), out,
                                       config=ConvTile(16, 16, 16, 4, 2, 16, 2))
    within_one_ulp(out, reference, magnitude, 27 * 16 + 2)


@needs_kernels
@pytest.mark.parametrize("out_layout,res_layout", [("channels_last", "ncdhw"), ("ncdhw", "frame_major"),
                                                   ("frame_major", "channels_last"), ("ncdhw", "channels_first_w")])
def test_flat_programs_in_every_layout(out_layout, res_layout):
    """Flat programs (16 consecutive positions of rows laid out 26 apart: most run past a row's end into the
    next row, the last past the last row) and a 16 + 16 channel split read the residual and store every pixel,
    in any layout, within the module's bound (the output starts NaN: every pixel is written)."""
    padded, weight, bias, residual = _operands(2, 16, 32, 2, 3, 24, torch.bfloat16, seed=11)
    reference = F.conv3d(padded.double(), weight.double(), bias.double()) + residual.double()
    magnitude = (F.conv3d(padded.double().abs(), weight.double().abs()) + bias.double().abs().view(-1, 1, 1, 1)
                 + residual.double().abs())
    out = EPILOGUE_LAYOUTS[out_layout](torch.full(reference.shape, float("nan"), dtype=torch.bfloat16, device=DEVICE))
    triton_conv3d.conv3d_channels_last(padded, weight, bias, EPILOGUE_LAYOUTS[res_layout](residual), out,
                                       config=ConvTile(16, 16, 16, 4, 2, 16, flat=True))
    within_one_ulp(out, reference, magnitude, 27 * 16 + 2)


def test_flat_tiles_span_two_rows_at_most():
    assert "flat tile" in triton_conv3d.tile_reason(ConvTile(32, 16, 16, 4, 2, flat=True), 16, 26)
    assert "flat tile" in triton_conv3d.tile_reason(ConvTile(16, 16, 16, 4, 2, rows=2, flat=True), 16, 26)
    assert triton_conv3d.tile_reason(ConvTile(16, 16, 16, 4, 2, flat=True), 16, 15) is None
    padded, weight, _, _ = _operands(1, 16, 16, 1, 2, 8, torch.bfloat16)
    out = torch.empty(1, 16, 1, 2, 8, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="flat tile"):
        triton_conv3d.conv3d_channels_last(padded, weight, None, None, out, config=ConvTile(32, 16, 16, 4, 2, flat=True))


@pytest.mark.parametrize("width,pixels,expected", [
    (1280, 256, (1, 256)), (640, 256, (2, 128)), (640, 128, (1, 128)), (320, 128, (2, 64)), (160, 128, (2, 64)),
    (832, 128, (2, 64)), (None, 128, (1, 128)), (40, 256, (2, 128)), (30, 256, (2, 128)),
])
def test_pixel_tile_computes_the_fewest_pixels_past_the_row_end(width, pixels, expected):
    assert triton_conv3d.pixel_tile(width, pixels) == expected


@pytest.mark.parametrize("channels,width,served,pixels", [
    (96, 1280, True, 256), (96, 832, True, 128), (96, 8, True, 128),  # 96: every width; 128-pixel programs at 832
    (192, 640, True, 128), (192, 416, True, 128),  # 192, 384: rows tiled exactly, or flat wasting <= 1%
    (384, 320, True, 128), (384, 160, False, 128), (384, 208, True, 128), (384, 104, False, 128),
    (256, 640, False, 128),
])
def test_the_conv_is_chosen_by_channels_and_row_width(channels, width, served, pixels):
    assert triton_conv3d.chosen(channels, channels, 27, width) is served
    tile = triton_conv3d.launch_config(channels, channels, width)
    assert tile.pixels == pixels
    assert tile.flat == (width in (416, 208, 160))  # flat where the row tiles waste more (104: wider than a row)


def test_a_symbolic_width_is_left_to_the_op():
    """A graph exported with symbolic sizes: the guard admits the channels, the op decides per call."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    width = ShapeEnv().create_unbacked_symint()
    assert triton_conv3d.chosen(192, 192, 27, width) and not triton_conv3d.chosen(256, 256, 27, width)
    assert triton_conv3d.chosen(96, 192, 27, width)  # a card measured it at some widths


@pytest.mark.parametrize("card,shape,served", [
    ("NVIDIA H100 80GB HBM3", (96, 192, 640), True), ("NVIDIA H200", (96, 192, 640), False),
    ("NVIDIA H100 80GB HBM3", (96, 192, 704), False),  # exactly the measured widths
    ("NVIDIA H100 80GB HBM3", (640, 640, 160), True), ("NVIDIA H100 80GB HBM3", (640, 640, 80), False),
    ("NVIDIA H100 80GB HBM3", (16, 96, 1280), True), ("NVIDIA H200", (16, 96, 1280), False),
    ("NVIDIA H200", (96, 96, 1280), True), ("NVIDIA H100 80GB HBM3", (96, 96, 1280), True),  # the shared table
    ("NVIDIA H200", (192, 192, 960), True), ("NVIDIA H100 80GB HBM3", (192, 192, 960), False),  # cuDNN on the H100
])
def test_a_cards_own_measurements_choose_for_that_card_only(monkeypatch, card, shape, served):
    monkeypatch.setattr(triton_conv3d.cards, "name", lambda device: card)
    in_channels, out_channels, width = shape
    assert triton_conv3d.chosen(in_channels, out_channels, 27, width, torch.device("cuda")) is served


def test_the_waste_is_judged_with_the_tile_the_card_launches(monkeypatch):
    """640 channels 160 wide: `launch_config`'s rule computes 20% past the row ends there, the H100's own flat
    tile 2 of 162 positions a row; with a 2% limit only the tile the card launches passes."""
    monkeypatch.setattr(triton_conv3d.cards, "name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(triton_conv3d, "CARD_FASTER_THAN_CUDNN", {})
    monkeypatch.setitem(triton_conv3d._FASTER_THAN_CUDNN, (640, 640, 27), 0.02)
    tile = triton_conv3d.card_launch_config(640, 640, 160, 3, torch.device("cuda"))
    assert tile.flat and tile == triton_conv3d.CARD_TILES["NVIDIA H100 80GB HBM3"][(640, 640, 160)]
    assert triton_conv3d.chosen(640, 640, 27, 160, torch.device("cuda"))
    assert not triton_conv3d.chosen(640, 640, 27, 160)  # no device: the rule's tile


@pytest.mark.parametrize("card,shape,tile", [(card, shape, tile) for card, tiles in triton_conv3d.CARD_TILES.items()
                                              for shape, tile in tiles.items()])
def test_every_card_tile_runs_its_shape(card, shape, tile):
    """A card's measured tile is one the kernel runs for its (in, out, width): K blocks dividing the input
    channels, a channel split summing to the outputs, a flat program within two padded rows."""
    in_channels, out_channels, width = shape
    assert triton_conv3d.tile_reason(tile, out_channels, width + 2) is None
    assert in_channels % tile.block_k == 0


def test_tiles_the_kernel_cannot_run_are_named():
    assert "rows per program" in triton_conv3d.tile_reason(ConvTile(64, 64, 32, 4, 2, 0, 3), 64)
    assert "split" in triton_conv3d.tile_reason(ConvTile(64, 64, 32, 4, 2, 32), 128)
    assert "split" in triton_conv3d.tile_reason(ConvTile(64, 64, 32, 4, 2, 24), 88)
    assert triton_conv3d.tile_reason(ConvTile(64, 128, 64, 8, 3, 64), 192) is None
    assert "three 32-channel pieces" in triton_conv3d.norm_epilogue_reason(96, ConvTile(64, 64, 32, 4, 2, 32)._replace(
        block_n=32, n_rest=32))
    padded, weight, _, _ = _operands(1, 16, 48, 1, 2, 8, torch.bfloat16)
    out = torch.empty(1, 48, 1, 2, 8, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="split"):
        triton_conv3d.conv3d_channels_last(padded, weight, None, None, out, config=ConvTile(16, 16, 16, 4, 2, 16))


def test_unsupported_shapes_and_dtypes_are_named():
    assert "fp32 keeps cuDNN" in triton_conv3d.unsupported_reason((1, 32, 3, 4, 4), (32, 32, 3, 3, 3), torch.float32)
    assert "multiple of 16" in triton_conv3d.unsupported_reason((1, 24, 3, 4, 4), (32, 24, 3, 3, 3), torch.bfloat16)
    assert triton_conv3d.unsupported_reason((1, 32, 3, 4, 4), (3, 32, 3, 3, 3), torch.bfloat16) is None
    assert triton_conv3d.launch_config(96, 3, 1280).block_n == triton_conv3d.MIN_OUT_CHANNELS
    assert triton_conv3d.unsupported_reason((1, 96, 6, 10, 10), (96, 96, 3, 3, 3), torch.bfloat16) is None
    # padded inputs of a 1-frame steady_t1 step: 2 cache frames + 1, 8 x 8 spatially padded to 10 x 10
    assert "cuDNN's conv measured faster" in wan_fast.conv_reason((1, 384, 3, 10, 10), (384, 384, 3, 3, 3),
                                                                  torch.bfloat16)
    assert wan_fast.conv_reason((1, 96, 3, 10, 10), (96, 96, 3, 3, 3), torch.bfloat16) is None


def test_kernel_rejects_bad_operands():
    padded, weight, bias, residual = _operands(1, 16, 16, 1, 2, 4, torch.bfloat16)
    out = torch.empty(1, 16, 1, 2, 4, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="channels-last"):
        triton_conv3d.conv3d_channels_last(padded.contiguous(), weight, None, None, out)
    with pytest.raises(ValueError, match="out must be"):
        triton_conv3d.conv3d_channels_last(padded, weight, None, None, out[:, :, :, :1])
    with pytest.raises(ValueError, match="residual must be"):
        triton_conv3d.conv3d_channels_last(padded, weight, None, residual[:, :8], out)


# ---- on the GPU: the Wan shape classes ---------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("c,t,h,w", [
    (96, 4, 72, 130), (96, 1, 45, 80), (96, 4, 9, 832),   # 256-pixel programs; two rows of 64 at 832 wide
    (192, 4, 12, 640), (384, 2, 15, 320),                 # 128 + 64 channels; two rows of 64 (an odd row count)
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_kernel_on_wan_shapes(c, t, h, w, dtype):
    """Each Wan shape class with the tile `launch_config` chooses for its width."""
    padded, weight, bias, residual = _operands(1, c, c, t, h, w, dtype)
    reference = F.conv3d(padded.double(), weight.double(), bias.double()) + residual.double()
    magnitude = (F.conv3d(padded.double().abs(), weight.double().abs()) + bias.double().abs().view(-1, 1, 1, 1)
                 + residual.double().abs())
    out = torch.empty(reference.shape, dtype=dtype, device=DEVICE)
    triton_conv3d.conv3d_channels_last(padded, weight, bias, residual, out)
    within_one_ulp(out, reference, magnitude, 27 * c + 2)
