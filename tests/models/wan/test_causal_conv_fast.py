"""The narrow-input causal conv of level ``channels_last`` (`rewrite.models.wan.causal_conv_fast`: the encoder's
first conv, 3 video channels widened with zeros to 16 for the Triton conv): its kernel path within the Triton
conv's bound against the fp64 conv, the exact op's next cache and output layout, and its routing (a call it does
not serve runs the ``lossless`` op, `torch.equal` to it)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.conv3d.conv3d import ConvTile
from rewrite.models.wan import causal_conv_fast
from rewrite.models.wan import ops as _wan_ops  # noqa: F401  (registers torch.ops.rewrite.causal_conv3d)
from rewrite.ops import selftest
from rewrite.ops.dispatch import INTERPRETING, use_backend
from tests.ulps import within_one_ulp

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")
SMALL = ConvTile(32, 16, 16, 4, 2)  # small tiles keep the interpreter fast


def _inputs(mode: str, residual: bool, channels: int = 3, out_channels: int = 16, width: int = 19, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    frames = {"chunk0": 1, "steady_t1": 1, "steady": 4}[mode]
    x = torch.rand(1, channels, frames, 3, width, generator=g) * 2 - 1  # a video's range
    cache = None if mode == "chunk0" else torch.rand(1, channels, 2, 3, width, generator=g) * 2 - 1
    weight = torch.randn(out_channels, channels, 3, 3, 3, generator=g) / (27 * channels) ** 0.5
    bias = torch.randn(out_channels, generator=g)
    res = torch.randn(1, out_channels, frames, 3, width, generator=g) if residual else None
    pad = [1, 1, 1, 1, 2, 0] if mode == "chunk0" else [1, 1, 1, 1, 0, 0]  # the cache supplies the causal frames
    to = lambda t: None if t is None else t.to(DEVICE, torch.bfloat16)  # noqa: E731
    return to(x), to(cache), pad, mode, to(weight), to(bias), to(res)


@pytest.fixture(params=["folded", "widened"])
def form_chosen(request, monkeypatch):
    """Let the router pick the Triton conv for one form's 16 -> 16 conv (tiny shapes: 9 taps folded, 27 widened)
    with small tiles; the form's name."""
    taps = {"folded": 9, "widened": 27}[request.param]
    monkeypatch.setattr(triton_conv3d, "_FASTER_THAN_CUDNN", {(16, 16, taps): math.inf})
    monkeypatch.setattr(triton_conv3d, "launch_config", lambda c, o, w=None, *_, **__: SMALL)
    monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *a, **k: True)
    return request.param


@needs_kernels
@pytest.mark.parametrize("mode", ["chunk0", "steady_t1", "steady"])
@pytest.mark.parametrize("residual", [False, True])
def test_narrow_conv_within_the_triton_conv_bound(form_chosen, kernel_allowed_on_cpu, monkeypatch, mode, residual):
    ran = []
    original = triton_conv3d.conv3d_channels_last
    monkeypatch.setattr(triton_conv3d, "conv3d_channels_last",
                        lambda *a, **k: ran.append((a[0].shape, a[1].shape)) or original(*a, **k))
    x, cache, pad, mode, weight, bias, res = args = _inputs(mode, residual)
    out, next_cache = torch.ops.rewrite.causal_conv3d_fast(*args)
    assert ran and ran[0][0][1] == causal_conv_fast.WIDENED_CHANNELS  # the kernel path ran, on 16 channels
    assert ran[0][1][4] == {"folded": 1, "widened": 3}[form_chosen]  # the kernel width of the form
    with use_backend("reference"):
        exact, exact_cache = torch.ops.rewrite.causal_conv3d(*args)
    assert torch.equal(next_cache, exact_cache)  # the next cache: x's channels, as the exact op's
    assert out.stride() == exact.stride()
    source = x if mode == "chunk0" else torch.cat([cache, x], 2)
    padded = F.pad(source.double(), pad)
    reference = F.conv3d(padded, weight.double(), bias.double())
    magnitude = F.conv3d(padded.abs(), weight.double().abs(), bias.double().abs())
    if res is not None:
        reference, magnitude = reference + res.double(), magnitude + res.double().abs()
    # one rounding of the fp32 sum of 3 * 27 products (the zero channels add exact zeros), bias and residual
    within_one_ulp(out, reference, magnitude, terms=3 * 27 + 2)


@needs_kernels
def test_a_conv_the_table_does_not_choose_runs_the_exact_op(kernel_allowed_on_cpu, monkeypatch):
    """19 wide: no card measured the widened conv there, so the op is the ``lossless`` op, `torch.equal`."""
    monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *a, **k: True)
    args = _inputs("steady", residual=True)
    out, next_cache = torch.ops.rewrite.causal_conv3d_fast(*args)
    exact, exact_cache = torch.ops.rewrite.causal_conv3d(*args)
    assert torch.equal(out, exact) and torch.equal(next_cache, exact_cache)


def test_plan_picks_the_form_and_names_what_declines(monkeypatch):
    shape = (1, 3, 6, 722, 1282)
    monkeypatch.setattr(triton_conv3d, "CARD_FASTER_THAN_CUDNN", {"a card": frozenset({(16, 96, 27, 1280)})})
    assert causal_conv_fast.plan(shape, (96, 3, 3, 3, 3), torch.bfloat16) == ("widened", None)  # folded unmeasured
    both_forms = frozenset({(16, 96, 9, 1280), (16, 96, 27, 1280)})
    monkeypatch.setitem(triton_conv3d.CARD_FASTER_THAN_CUDNN, "a card", both_forms)
    assert "16 input channels (this op widens inputs of fewer than 16)" in causal_conv_fast.reason(
        (1, 16, 6, 10, 10), (96, 16, 3, 3, 3), torch.bfloat16)
    assert "dtype torch.float32" in causal_conv_fast.reason(shape, (96, 3, 3, 3, 3), torch.float32)
    assert causal_conv_fast.plan(shape, (96, 3, 3, 3, 3), torch.bfloat16) == ("folded", None)  # preferred
    assert causal_conv_fast.plan(shape, (96, 3, 3, 3, 3), torch.bfloat16, pad=[2, 0, 1, 1, 0, 0])[0] == "widened"
    assert causal_conv_fast.plan((1, 12, 6, 354, 642), (96, 12, 3, 3, 3), torch.bfloat16)[0] is None  # 36 > 16
    reason = causal_conv_fast.reason((1, 3, 6, 722, 1002), (96, 3, 3, 3, 3), torch.bfloat16)
    assert "folded: cuDNN's conv measured faster" in reason and "widened: cuDNN's conv measured faster" in reason


@pytest.mark.parametrize("version", ["wan2.1", "wan2.2"])
def test_the_pattern_takes_the_encoders_first_conv_only(monkeypatch, version):
    """Structure on a CPU capture of the tiny encoder standing in for a CUDA one (the interpreter's gate patched,
    the widened conv chosen for the tiny model's channels): at ``channels_last`` the first conv (3 channels, or
    Wan 2.2's 12 after the patchify) becomes the op in both step graphs, nothing else does; ``lossless`` keeps
    the exact op."""
    from rewrite.models.wan.config import build_wan
    from rewrite.models.wan.encoder_capture import capture_wan_encoder
    from rewrite.ops import dispatch
    from rewrite.pipeline import rewrite_graph

    monkeypatch.setattr(dispatch, "INTERPRETING", True)
    vae = build_wan(version, "tiny").to(torch.bfloat16)
    first = vae.encoder.conv_in
    assert first.in_channels < causal_conv_fast.WIDENED_CHANNELS
    monkeypatch.setattr(triton_conv3d, "CARD_FASTER_THAN_CUDNN",
                        {"any": frozenset({(16, first.out_channels, 27, 1280)})})
    fast = torch.ops.rewrite.causal_conv3d_fast.default
    for level, expected in (("channels_last", 1), ("lossless", 0)):
        for graph in capture_wan_encoder(vae.encoder, torch.bfloat16, torch.device("cpu")):
            rewrite_graph(graph, level)
            nodes = [n for n in graph.graph_module.graph.nodes if n.target is fast]
            assert len(nodes) == expected, (level, graph.name, len(nodes))
            for node in nodes:
                assert node.args[4].meta["val"].shape[1] == first.in_channels
