"""Which Wan graphs serve a decode (`WanRunner.graph_key`): the first latent sizes get graphs exported for that
size alone, later sizes share graphs with symbolic sizes, and both kinds rewrite to the same ops.

Every decode here is `torch.equal` to the module at level "off" (the tiny decoders on the CPU at `lossless`).
"""

from __future__ import annotations

import collections

import pytest
import torch

from rewrite import optimize, report, warmup
from rewrite.models.wan import capture as wan_capture
from rewrite.models.wan.config import build_wan
from rewrite.pipeline import rewrite_graph
from rewrite.models.wan.runner import WanRunner
from tests import quick


@pytest.fixture
def captures(monkeypatch):
    """The `size` argument of every Wan capture (None: symbolic sizes)."""
    sizes = []
    original = wan_capture.capture_wan_decoder

    def recorded(decoder, dtype, device, size=None):
        sizes.append(size)
        return original(decoder, dtype, device, size)

    monkeypatch.setattr("rewrite.models.wan.runner.capture_wan_decoder", recorded)
    return sizes


def _latents(vae, height, width, batch=1, frames=2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vae.config.z_dim, frames, height, width, generator=generator)


def _decode_both(vae, reference, z):
    with torch.no_grad():
        got, want = vae.decode(z).sample, reference.decode(z).sample
    assert report(vae).last_path == "graphs" and torch.equal(got, want)


def test_first_sizes_static_then_symbolic_graphs_serve_every_later_size(captures, monkeypatch):
    monkeypatch.setattr(WanRunner, "STATIC_SIZES", 2)
    vae, reference = optimize(build_wan("wan2.1", "tiny")), build_wan("wan2.1", "tiny")
    _decode_both(vae, reference, _latents(vae, 4, 6))
    assert captures == [(1, 4, 6)]
    _decode_both(vae, reference, _latents(vae, 4, 6, seed=1))  # the same size: its own graphs, no capture
    assert captures == [(1, 4, 6)]
    _decode_both(vae, reference, _latents(vae, 3, 5))  # a second size: graphs of its own too
    _decode_both(vae, reference, _latents(vae, 5, 3))  # past STATIC_SIZES: the symbolic graphs
    assert captures == [(1, 4, 6), (1, 3, 5), None]
    _decode_both(vae, reference, _latents(vae, 5, 4, batch=2))  # and every size after it
    _decode_both(vae, reference, _latents(vae, 4, 6, seed=2))  # the first sizes keep their own
    assert captures == [(1, 4, 6), (1, 3, 5), None]
    names = [(g.name, g.dtype) for g in report(vae).graphs]
    assert len(names) == 6 and sorted(set(names)) == [("chunk0", "torch.float32"), ("steady", "torch.float32")]
    assert [g.sizes for g in report(vae).graphs] == ["1x4x6"] * 2 + ["1x3x5"] * 2 + ["any"] * 2
    assert "1x3x5" in str(report(vae))
    runner = vae._rewrite_runner
    assert runner.graph_key(_latents(vae, 4, 6)) == (torch.float32, torch.device("cpu"), (1, 4, 6))
    assert runner.graph_key(_latents(vae, 7, 7)) == (torch.float32, torch.device("cpu"), None)


def test_warmup_without_shapes_captures_the_symbolic_graphs(captures):
    vae, reference = optimize(build_wan("wan2.1", "tiny")), build_wan("wan2.1", "tiny")
    result = warmup(vae)
    assert captures == [None] and "symbolic" in result.note
    _decode_both(vae, reference, _latents(vae, 4, 6))
    assert captures == [None]


def test_warmup_captures_what_the_decodes_of_its_shapes_would(captures, monkeypatch):
    monkeypatch.setattr(WanRunner, "STATIC_SIZES", 1)
    vae = optimize(build_wan("wan2.1", "tiny"))
    warmup(vae, shapes=[(4, 6), (3, 5)])
    assert captures == [(1, 4, 6), None]


def test_a_static_disk_cache_entry_serves_its_size_only(tmp_path, captures):
    """A later process (a fresh module) decoding another size first must not read the first size's graphs."""
    reference = build_wan("wan2.1", "tiny")
    first = optimize(build_wan("wan2.1", "tiny"), cache_dir=tmp_path)
    _decode_both(first, reference, _latents(first, 4, 6))
    other = optimize(build_wan("wan2.1", "tiny"), cache_dir=tmp_path)
    _decode_both(other, reference, _latents(other, 3, 5))
    assert captures == [(1, 4, 6), (1, 3, 5)] and {g.source for g in report(other).graphs} == {"export"}
    again = optimize(build_wan("wan2.1", "tiny"), cache_dir=tmp_path)
    _decode_both(again, reference, _latents(again, 4, 6, seed=3))
    assert len(captures) == 2 and {g.source for g in report(again).graphs} == {"disk cache"}


def _rewritten_ops(graph) -> collections.Counter:
    return collections.Counter(str(n.target) for n in graph.graph_module.graph.nodes
                               if n.op == "call_function" and str(n.target).startswith("rewrite."))


@pytest.mark.parametrize("level,version", quick.product({"lossless": ("lossless",), "channels_last": ("channels_last",)},
                                                        {"wan2.1": ("wan2.1",), "wan2.2": ("wan2.2",)}))
def test_static_and_symbolic_graphs_rewrite_to_the_same_ops(version, level):
    """A static export (batch 1 included: no size-1 special case changes what the patterns see) fuses exactly
    what the symbolic one fuses."""
    decoder = build_wan(version, "tiny").decoder
    symbolic = wan_capture.capture_wan_decoder(decoder, torch.float32, torch.device("cpu"))
    static = wan_capture.capture_wan_decoder(decoder, torch.float32, torch.device("cpu"), (1, 4, 6))
    for a, b in zip(symbolic, static):
        rewrite_graph(a, level)
        rewrite_graph(b, level)
        assert _rewritten_ops(a) == _rewritten_ops(b) and sum(_rewritten_ops(a).values()) > 0
