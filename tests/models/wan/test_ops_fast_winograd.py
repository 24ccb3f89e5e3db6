"""The fast norm + causal conv op's Winograd route (`rewrite.models.wan.ops_fast`): where `winograd.chosen` names a
tile for the conv, the op convolves the norm kernel's padded input with the Winograd kernel and the weight's kept
transform; elsewhere the routes stay as they were.

Tolerance of the conv against float64: the Winograd kernel's derived bound (tests/kernels/winograd/test_winograd.py
and test_large_tile.py state them), with one fp32 addition more on every path (the residual's deferred bias joins
the bias in fp32).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.winograd import weight_store, winograd
from rewrite.kernels.winograd.transforms import transformed_weight
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.ops import run_context
from rewrite.ops.dispatch import INTERPRETING
from tests.kernels.winograd import test_large_tile, test_winograd

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")
TILE = winograd.WinogradTile(16, 16, 16, 4, 1, materialized=True, split_output=True)  # the H100 entry's form
TILE_4 = TILE._replace(output_block=4)  # F(4x4, 3x3)
SHAPE, WEIGHT = (1, 1024, 4, 92, 162), (1024, 1024, 3, 3, 3)  # Wan 2.2 720p's up block 1, as the guard sees it


def test_no_conv_takes_winograd_off_a_measured_card():
    """No card's table is read for a CPU device (nor without a device): the conv stays where it was."""
    assert wan_fast.winograd_tile(SHAPE, WEIGHT, torch.bfloat16, torch.device("cpu")) is None
    assert wan_fast.winograd_tile(SHAPE, WEIGHT, torch.bfloat16) is None
    assert "one-pass norm is not chosen for 1024" in wan_fast.fast_reason(SHAPE, WEIGHT, torch.bfloat16,
                                                                          torch.device("cpu"))


def test_a_card_entry_is_read_by_exact_width_and_dtype(monkeypatch):
    """The H100's entry (`_MEASURED_FASTER`) is read for its card, width and dtype only."""
    from rewrite.kernels import cards
    from rewrite.kernels.winograd import common

    card = "NVIDIA H100 80GB HBM3"
    assert (1024, 1024, 160, torch.bfloat16) in common._MEASURED_FASTER[card]
    monkeypatch.setattr(cards, "name", lambda device: card)
    cuda = torch.device("cuda")
    tile = wan_fast.winograd_tile(SHAPE, WEIGHT, torch.bfloat16, cuda)
    assert tile is not None and tile.materialized and tile.split_output and tile.output_block == 4
    assert wan_fast.fast_reason(SHAPE, WEIGHT, torch.bfloat16, cuda) is None  # the fast op now takes 1024
    assert wan_fast.winograd_tile((1, 1024, 4, 122, 242), WEIGHT, torch.bfloat16, cuda) is None  # 1080p: unmeasured
    assert wan_fast.winograd_tile(SHAPE, WEIGHT, torch.float16, cuda) is None  # fp16: unmeasured
    assert wan_fast.winograd_tile(SHAPE, (1024, 1024, 3, 1, 1), torch.bfloat16, cuda) is None  # not 3x3


def test_every_table_entry_is_reached_by_the_op(monkeypatch):
    """Every routed entry gets its tile from the op's lookup at its shape (a tile the kernel's checks decline would
    leave the entry dead, and a decode measured "with" it would have measured without it), ahead of the direct
    conv where that is chosen too."""
    from rewrite.kernels import cards
    from rewrite.kernels.winograd import common

    cuda = torch.device("cuda")
    for card, entries in common._MEASURED_FASTER.items():
        monkeypatch.setattr(cards, "name", lambda device, card=card: card)
        for (in_channels, out_channels, width, dtype), tile in entries.items():
            shape, weight = (1, in_channels, 4, 14, width + 2), (out_channels, in_channels, 3, 3, 3)
            assert wan_fast.winograd_tile(shape, weight, dtype, cuda) == tile
            assert wan_fast._winograd_runs_first(shape, weight, dtype, cuda)


def test_the_winograd_table_runs_ahead_of_the_direct_conv(monkeypatch):
    """A conv both the direct conv and the Winograd table serve: the fast op does not take the direct conv
    (`_route`), a pair whose second conv it is splits into two ops (`pair_reason`), and a guard's symbolic width
    keeps the pair (the ops decide on their tensors)."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from rewrite.kernels import cards

    monkeypatch.setattr(cards, "name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(wan_fast, "conv_reason", lambda *args: None)  # the direct conv is chosen
    cuda = torch.device("cuda")
    shape, weight = (1, 192, 4, 92, 162), (192, 192, 3, 3, 3)  # Wan 2.1 720p's 192-channel level (no entry)
    assert not wan_fast._winograd_runs_first(shape, weight, torch.bfloat16, cuda)
    assert wan_fast.pair_reason(192, 192, shape, weight, torch.bfloat16, "silu", cuda) is None
    monkeypatch.setattr(winograd, "chosen", lambda *args: TILE_4)  # now the table names it
    assert wan_fast._winograd_runs_first(shape, weight, torch.bfloat16, cuda)
    assert "Winograd" in wan_fast.pair_reason(192, 192, shape, weight, torch.bfloat16, "silu", cuda)
    env = ShapeEnv()
    width = env.create_symintnode(env.create_symbol(162, ConstantSource("width")), hint=162)
    symbolic = (*shape[:4], width)
    assert not wan_fast._winograd_runs_first(symbolic, weight, torch.bfloat16, cuda)
    assert wan_fast.pair_reason(192, 192, symbolic, weight, torch.bfloat16, "silu", cuda) is None


def _case(seed: int, residual: bool, residual_bias: bool):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 16, 2, 5, 7, generator=g).to(torch.bfloat16)
    cache = torch.randn(1, 16, 2, 5, 7, generator=g).to(torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn(16, 1, 1, 1, generator=g)).to(torch.bfloat16)
    weight = (torch.randn(16, 16, 3, 3, 3, generator=g) / (27 * 16) ** 0.5).to(torch.bfloat16)
    bias = torch.randn(16, generator=g).to(torch.bfloat16)
    res = torch.randn(1, 16, 2, 5, 7, generator=g).to(torch.bfloat16) if residual else None
    res_bias = torch.randn(16, generator=g).to(torch.bfloat16) if residual_bias else None
    return [t if t is None else t.to(DEVICE) for t in (x, cache, gamma, weight, bias, res, res_bias)]


def _route_to_winograd(monkeypatch, tile=TILE):
    from tests.op_cases import kernel_gates_open

    kernel_gates_open(monkeypatch)
    monkeypatch.setattr(triton_conv3d, "_FASTER_THAN_CUDNN", {})  # the direct conv is not chosen
    monkeypatch.setattr(winograd, "chosen", lambda *args: tile)


def _record_calls(monkeypatch) -> list:
    """The tiles the op's Winograd convs ran with, by either entry (F(2x2, 3x3)'s or F(4x4, 3x3)'s)."""
    from rewrite.kernels.winograd import large_tile

    calls = []
    small, large = winograd.winograd_conv3d_channels_last, large_tile.large_tile_conv3d
    monkeypatch.setattr(winograd, "winograd_conv3d_channels_last", lambda *a: calls.append(a[-1]) or small(*a))
    monkeypatch.setattr(large_tile, "large_tile_conv3d", lambda *a: calls.append(a[-1]) or large(*a))
    return calls


@needs_kernels
@pytest.mark.parametrize("tile", (TILE, TILE_4), ids=("F(2x2, 3x3)", "F(4x4, 3x3)"))
@pytest.mark.parametrize("residual,residual_bias", [(False, False), (True, False), (True, True)],
                         ids=("bias", "residual", "residual-and-its-bias"))
def test_the_fast_op_convolves_by_winograd_where_chosen(kernel_allowed_on_cpu, monkeypatch, residual, residual_bias,
                                                        tile):
    """The next cache is the norm kernel's, bit for bit; the output is the conv of that kernel's padded input within
    the Winograd bound of float64 (module docstring), stored in the layout the direct conv's route gives. F(4x4, 3x3)
    scales its fp16 input by the norm's bound from gamma, not by the input itself."""
    _route_to_winograd(monkeypatch, tile)
    calls = _record_calls(monkeypatch)
    x, cache, gamma, weight, bias, res, res_bias = _case(3, residual, residual_bias)
    pad = [1, 1, 1, 1, 0, 0]  # the two cached frames stand before x
    out, next_cache = torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, gamma, 4.0, 0.0, 1e-12, True, "silu", cache,
                                                                    pad, "steady", weight, bias, res, None, res_bias)
    assert calls == [tile], "the Winograd conv did not run"
    padded, expected_cache = wan_fast._normalized_input(x, gamma, 4.0, 0.0, 1e-12, True, "silu", cache, pad, "steady",
                                                        None)
    assert padded.abs().max() <= wan_fast._norm_output_bound(gamma, 4.0, 0.0)
    assert torch.equal(next_cache, expected_cache)
    padded, weight, bias = padded.cpu(), weight.cpu(), bias.cpu()
    exact = F.conv3d(padded.double(), weight.double(), bias.double())
    magnitude_bias = bias.double().abs()
    if res is not None:
        exact = exact + res.cpu().double()
    if res_bias is not None:
        exact = exact + res_bias.cpu().double()[:, None, None, None]
        magnitude_bias = magnitude_bias + res_bias.cpu().double().abs()
    # one fp32 addition more on every path than the kernel's own bound counts: the deferred bias joining the bias
    derived = test_large_tile._bound if tile.output_block == 4 else test_winograd._bound
    bound = derived(padded, weight, magnitude_bias, None if res is None else res.cpu(), exact, torch.bfloat16,
                    more_additions=1)
    error = (out.cpu().double() - exact).abs()
    assert torch.all(error <= bound), f"worst error / bound {(error / bound).max().item():.3g}"
    assert out.stride() == wan_fast._conv_output(padded, weight, res, False).stride()


@needs_kernels
def test_the_fast_op_takes_winograd_where_the_direct_conv_is_chosen_too(kernel_allowed_on_cpu, monkeypatch):
    """The Winograd table runs ahead of the direct conv: with both choosing the conv, the Winograd kernel runs and
    the direct one does not."""
    _route_to_winograd(monkeypatch, TILE_4)
    monkeypatch.setattr(wan_fast, "conv_reason", lambda *args: None)  # the direct conv is chosen as well
    monkeypatch.setattr(triton_conv3d, "conv3d_channels_last", lambda *a, **k: pytest.fail("the direct conv ran"))
    calls = _record_calls(monkeypatch)
    x, cache, gamma, weight, bias, _, _ = _case(6, False, False)
    routes = set()
    with run_context.using(routes=routes):  # as a size's capture collects them for `report()`
        torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, gamma, 4.0, 0.0, 1e-12, True, "silu", cache,
                                                      [1, 1, 1, 1, 0, 0], "steady", weight, bias, None)
    assert calls == [TILE_4], "the Winograd conv did not run"
    assert routes == {"Winograd F(4x4, 3x3): 16 -> 16 channels at 2x5x7, bfloat16"}


@needs_kernels
def test_the_chain_ops_first_conv_of_a_normalized_input_takes_winograd(kernel_allowed_on_cpu, monkeypatch):
    """The chain op's fallback for a first conv whose input the op before normalized: by Winograd where its table
    names the conv (channels-last, no bias, within the kernel's derived bound of the float64 conv), else ATen's."""
    from rewrite.models.wan.ops import ConvStage

    _route_to_winograd(monkeypatch, TILE_4)
    calls = _record_calls(monkeypatch)
    x, cache, gamma, weight, bias, _, _ = _case(7, False, False)
    pad = [1, 1, 1, 1, 0, 0]
    normalized, _ = wan_fast._normalized_input(x, gamma, 4.0, 0.0, 1e-12, True, "silu", cache, pad, "steady", None)
    first = ConvStage(gamma, 4.0, 0.0, 1e-12, True, "silu", cache, pad, "steady", weight, bias)
    y = wan_fast._first_conv_of_normalized(normalized, weight, first)
    assert calls == [TILE_4], "the Winograd conv did not run"
    assert y.is_contiguous(memory_format=torch.channels_last_3d)
    padded, weight = normalized.cpu(), weight.cpu()
    exact = F.conv3d(padded.double(), weight.double())
    bound = test_large_tile._bound(padded, weight, None, None, exact, torch.bfloat16)
    error = (y.cpu().double() - exact).abs()
    assert torch.all(error <= bound), f"worst error / bound {(error / bound).max().item():.3g}"
    monkeypatch.setattr(winograd, "chosen", lambda *args: None)
    weight = weight.to(normalized.device).contiguous(memory_format=torch.channels_last_3d)
    expected = torch.ops.aten.conv3d.default(normalized, weight, None)  # ATen's conv, as the exact op runs it
    assert torch.equal(wan_fast._first_conv_of_normalized(normalized, weight, first), expected)


@needs_kernels
def test_winograd_without_a_norm_kernel_runs_the_lossless_op_and_says_so(kernel_allowed_on_cpu, monkeypatch, caplog):
    """Winograd chosen, but no norm kernel serves x (no exact plan, 16 channels not one-pass): the lossless op's
    answer, the Winograd kernel not run, and one INFO line naming it."""
    from rewrite.kernels import layout

    _route_to_winograd(monkeypatch)
    monkeypatch.setattr(layout, "norm_plan", lambda *a, **k: None)
    monkeypatch.setattr(winograd, "winograd_conv3d_channels_last", lambda *a: pytest.fail("the Winograd conv ran"))
    wan_fast._log_no_norm_kernel.cache_clear()
    x, cache, gamma, weight, bias, _, _ = _case(5, False, False)
    args = (x, gamma, 4.0, 0.0, 1e-12, True, "silu", cache, [1, 1, 1, 1, 0, 0], "steady", weight, bias, None)
    with caplog.at_level("INFO", logger="rewrite"):
        out, _ = torch.ops.rewrite.rms_norm_causal_conv3d_fast(*args)
    exact, _ = torch.ops.rewrite.rms_norm_causal_conv3d(*args)
    assert torch.equal(out, exact)
    assert [r.getMessage() for r in caplog.records if "Winograd conv is chosen for 16 -> 16" in r.getMessage()]


@needs_kernels
def test_the_first_chunk_refreshes_the_kept_transform(kernel_allowed_on_cpu, monkeypatch):
    """F(2x2, 3x3): a weight updated in place between decodes: the next decode's first chunk (``chunk0``) transforms
    it again, so its later chunks (replayed graphs read the kept tensor) see the new weight."""
    _route_to_winograd(monkeypatch, TILE)
    x, _, gamma, weight, bias, _, _ = _case(4, False, False)
    x = x[:, :, :1]  # a decode's first chunk: one frame
    pad = [1, 1, 1, 1, 2, 0]
    args = (gamma, 4.0, 0.0, 1e-12, True, "silu", None, pad, "chunk0", weight, bias, None)
    calls = _record_calls(monkeypatch)
    torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, *args)
    assert calls == [TILE], "the Winograd conv did not run"
    kept = weight_store.transformed_for(weight, refresh=False)
    with torch.no_grad():
        weight.mul_(-1)
    torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, *args)
    assert weight_store.transformed_for(weight, refresh=False) is kept
    assert torch.equal(kept, transformed_weight(weight))


@needs_kernels
def test_the_large_tile_computes_its_points_in_the_call_with_scales_the_first_chunk_refreshes(
        kernel_allowed_on_cpu, monkeypatch):
    """F(4x4, 3x3): only the point scales are kept (`weight_store.transformed_4_for`); a weight updated in place
    reaches the next decode through its first chunk (``chunk0`` refreshes the scales), and the steady chunk after it
    equals the op's answer for a new weight tensor of the same values."""
    _route_to_winograd(monkeypatch, TILE_4)
    x, cache, gamma, weight, bias, _, _ = _case(4, False, False)
    common = (gamma, 4.0, 0.0, 1e-12, True, "silu")
    steady = (cache, [1, 1, 1, 1, 0, 0], "steady")
    first = (None, [1, 1, 1, 1, 2, 0], "chunk0")
    calls = _record_calls(monkeypatch)
    before, _ = torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, *common, *steady, weight, bias, None)
    with torch.no_grad():
        weight.mul_(8)  # the points' scales change
    torch.ops.rewrite.rms_norm_causal_conv3d_fast(x[:, :, :1], *common, *first, weight, bias, None)
    after, _ = torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, *common, *steady, weight, bias, None)
    fresh, _ = torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, *common, *steady, weight.clone(), bias, None)
    assert calls == [TILE_4] * 4, "the Winograd conv did not run"
    assert torch.equal(after, fresh) and not torch.equal(after, before)
    kept = [entry.transformed for key, entry in weight_store._TRANSFORMED.items() if key[0] == id(weight)]
    assert [tuple(t.shape) for t in kept[0]] == [(36,)]
