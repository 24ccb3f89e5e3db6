"""`drop_redundant_clones`: structural (which clones go, which stay) and numeric (`torch.equal` before/after)."""

from __future__ import annotations

import copy

import pytest
import torch

from rewrite.passes.canonicalize import canonicalize
from rewrite.passes.drop_clones import drop_redundant_clones
from rewrite.passes.fuse_patterns import fuse_patterns
from rewrite.passes.manager import PassContext
from tests.captures import tiny_wan

aten = torch.ops.aten


def _clones(gm):
    return [n for n in gm.graph.nodes if n.target is aten.clone.default]


def _export(module, *inputs):
    return torch.export.export(module, inputs, strict=False).module()


def test_wan22_steady_graph_loses_the_up_block_input_clones_and_stays_equal():
    vae, (chunk0, steady) = tiny_wan("wan2.2")
    ctx = PassContext(level="lossless")
    canonicalize(steady.graph_module, ctx)
    fuse_patterns(steady.graph_module, ctx)
    before = copy.deepcopy(steady.graph_module)
    clones = len(_clones(before))
    result = drop_redundant_clones(steady.graph_module, ctx)
    up_blocks = len(vae.decoder.up_blocks)
    assert clones == up_blocks  # `x_copy = x.clone()` of each up block
    # The first up block's input comes out of the mid-block attention in a permuted layout that the exported
    # clone makes contiguous (a layout change: kept); the other blocks' clones keep their input's strides.
    assert result.stats["dropped"] == up_blocks - 1
    (kept,) = _clones(steady.graph_module)
    assert kept.meta["val"].stride() != kept.args[0].meta["val"].stride()
    generator = torch.Generator().manual_seed(0)
    x0, x1 = (torch.randn(1, vae.config.z_dim, 1, 4, 6, generator=generator) for _ in range(2))
    with torch.no_grad():
        _, *caches = chunk0(chunk0.weights(vae.decoder), x0)
    args = [next(user) if kind == "user" else w for user in [iter([x1, *caches])]
            for w, (kind, _) in zip(steady.weights(vae.decoder), steady.input_kinds)]
    with torch.no_grad():
        expected, got = before(*args), steady.graph_module(*args)
    assert len(expected) == len(got) and all(torch.equal(a, b) for a, b in zip(expected, got))


class _CloneToOutput(torch.nn.Module):
    def forward(self, x):
        return x.clone().view(-1), torch.relu(x.clone())


class _CloneChannelsLast(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x.clone(memory_format=torch.channels_last))


def test_a_clone_reaching_an_output_and_a_layout_changing_clone_stay():
    gm = _export(_CloneToOutput(), torch.randn(2, 3))
    assert len(_clones(gm)) == 2
    result = drop_redundant_clones(gm)
    assert result.stats["dropped"] == 1 and len(_clones(gm)) == 1
    assert next(iter(_clones(gm)[0].users)).target is aten.view.default  # the one whose view is returned
    gm = _export(_CloneChannelsLast(), torch.randn(2, 3, 4, 5))
    assert drop_redundant_clones(gm).stats["dropped"] == 0


def test_nothing_is_dropped_from_a_graph_that_mutates():
    gm = _export(_CloneToOutput(), torch.randn(2, 3))
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_after(x):
        gm.graph.call_function(aten.add_.Tensor, (x, 1.0))
    result = drop_redundant_clones(gm)
    assert result.stats["dropped"] == 0 and "add_" in result.stats["skipped"]


@pytest.mark.parametrize("frame_major", [False, True])
def test_the_clone_of_a_permuted_dense_tensor_is_dropped(frame_major):
    class PermutedClone(torch.nn.Module):
        def forward(self, x):
            y = x.permute(0, 2, 1, 3, 4) if frame_major else x
            return torch.relu(y.clone()) + 1

    x = torch.randn(1, 2, 3, 4, 5)
    gm = _export(PermutedClone(), x)
    expected = gm(x)
    assert drop_redundant_clones(gm).stats["dropped"] == 1
    assert torch.equal(gm(x), expected)


class _ZeroPads(torch.nn.Module):
    def forward(self, x):
        padded = torch.nn.functional.pad(x, (0, 0, 0, 0))  # a clone: its view's reader reads x instead
        returned = torch.nn.functional.pad(x, (0, 0, 0, 0))  # a graph output must not alias x: kept
        return torch.relu(padded.view(-1)), torch.nn.functional.pad(x, (1, 0, 0, 0)), returned


def _pads(gm):
    return [n.args[1] for n in gm.graph.nodes if n.target is aten.pad.default]


def test_a_pad_by_zero_is_dropped_like_a_clone_unless_it_reaches_an_output():
    x = torch.randn(2, 3, 4, 5)
    gm = _export(_ZeroPads(), x)
    before = copy.deepcopy(gm)
    assert sorted(_pads(gm)) == [[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
    assert drop_redundant_clones(gm).stats["dropped"] == 1
    assert sorted(_pads(gm)) == [[0, 0, 0, 0], [1, 0, 0, 0]]
    expected, got = before(x), gm(x)
    assert all(torch.equal(a, b) and a.stride() == b.stride() for a, b in zip(expected, got))


def test_the_wan22_encoders_avg_down_pads_by_zero_frames_go():
    """Wan 2.2's encoder pads each `AvgDown3D` shortcut's input by `pad_t` frames: 0 in a steady step (a copy of
    the block input for nothing), 1 for the temporal blocks' single frame in chunk 0 (kept: as an ATen pad, or
    as the pad argument of `rewrite::avg_down_add` where that pattern took the shortcut, under the interpreter).
    The encodes stay `torch.equal` to diffusers (tests/models/wan/test_encode.py)."""
    from rewrite.models.wan.config import build_wan
    from rewrite.models.wan.encoder_capture import capture_wan_encoder
    from rewrite.pipeline import rewrite_graph

    vae = build_wan("wan2.2", "tiny")
    chunk0, steady = capture_wan_encoder(vae.encoder, torch.float32, torch.device("cpu"))
    zero = [0, 0, 0, 0, 0, 0]
    assert zero in _pads(steady.graph_module) and zero in _pads(chunk0.graph_module)
    for graph in (chunk0, steady):
        rewrite_graph(graph, "lossless")
    kept = {name: _pads(graph.graph_module) + [n.args[2] for n in graph.graph_module.graph.nodes
                                               if n.target is torch.ops.rewrite.avg_down_add.default and any(n.args[2])]
            for name, graph in (("chunk0", chunk0), ("steady", steady))}
    assert kept == {"chunk0": [[0, 0, 0, 0, 1, 0]] * 2, "steady": []}
