"""`rewrite.models.wan.cache_writes`: steady-step graphs that write their new caches early, exactly.

The tiny Wan decoders' steady graphs (captured and rewritten at `lossless` on the CPU) run before and after
the transform on the same inputs: the output and the caches left in the buffers must be `torch.equal` to the
original's output and new caches. Small hand-made graphs check the aliasing rules.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from rewrite.ops import cache_into
from rewrite.pipeline import rewrite_graph
from rewrite.models.wan.cache_writes import static_cache_formats, write_caches_in_place
from tests.captures import tiny_wan

aten = torch.ops.aten


@pytest.mark.parametrize("version", ["wan2.1", "wan2.2"])
def test_steady_graph_writes_every_cache_early_and_exactly(version):
    vae, (_, steady) = tiny_wan(version)
    rewrite_graph(steady, "lossless")
    names = steady.user_input_names
    module, late = write_caches_in_place(steady.graph_module, names)
    assert late == []  # no Wan cache is a view of another
    copies = [n for n in module.graph.nodes if n.target is aten.copy_.default]
    writers = [n for n in module.graph.nodes if n.target is cache_into.write_next_caches_into]
    assert writers  # the fused norm + conv ops write their next caches into the buffers themselves
    assert len(copies) + sum(len(n.args[1]) for n in writers) == len(names) - 1
    # each copy comes after every node that reads its cache buffer
    order = {n: i for i, n in enumerate(module.graph.nodes)}
    for copy_node in copies:
        cache = copy_node.args[0]
        assert all(order[user] <= order[copy_node] for user in cache.users if user.op != "output")
    weights = steady.weights(vae.decoder)
    placeholders = [n for n in steady.graph_module.graph.nodes if n.op == "placeholder"]
    shapes = {n.name: n.meta["val"] for n in placeholders}
    generator = torch.Generator().manual_seed(0)
    inputs = [torch.randn([int(s) for s in (d.node.hint if isinstance(d, torch.SymInt) else d for d in shapes[name].shape)],
                          generator=generator) for name in names]
    with torch.no_grad():
        y, *new = steady(weights, *inputs)
        buffers = [t.clone() for t in inputs]
        in_place = type(steady)(**{**steady.__dict__, "graph_module": module})
        (y2,) = in_place(weights, *buffers)
    assert torch.equal(y2, y)
    assert torch.equal(buffers[0], inputs[0])  # x is not a cache: untouched
    for written, expected in zip(buffers[1:], new):
        assert torch.equal(written, expected)


def _graph(fn, n_inputs: int) -> fx.GraphModule:
    graph = fx.Graph()
    inputs = [graph.placeholder(f"in{i}") for i in range(n_inputs)]
    graph.output(tuple(fn(graph, *inputs)))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_new_cache_that_views_an_old_one_is_left_to_the_end():
    def body(g, x, c0, c1):
        y = g.call_function(aten.add.Tensor, (x, c0))
        new0 = g.call_function(aten.slice.Tensor, (c1, 0, 1, None))  # a view of cache 1
        new1 = g.call_function(aten.mul.Tensor, (c1, 2))
        return [y, new0, new1]

    module, late = write_caches_in_place(_graph(body, 3), ["in0", "in1", "in2"])
    assert late == [0, 1]  # cache 0's new value views cache 1: both stay outputs
    assert not any(n.target is aten.copy_.default for n in module.graph.nodes)


def test_an_output_that_views_a_cache_moves_nothing():
    def body(g, x, c0):
        y = g.call_function(aten.view.default, (c0, [-1]))
        return [y, g.call_function(aten.add.Tensor, (x, c0))]

    module, late = write_caches_in_place(_graph(body, 2), ["in0", "in1"])
    assert late == [0]


def test_a_copy_waits_for_readers_of_views_of_its_cache():
    def body(g, x, c0):
        view = g.call_function(aten.slice.Tensor, (c0, 0, 0, 2))
        new0 = g.call_function(aten.mul.Tensor, (x, 3))
        late_reader = g.call_function(aten.add.Tensor, (view, view))
        return [late_reader, new0]

    module, late = write_caches_in_place(_graph(body, 2), ["in0", "in1"])
    nodes = list(module.graph.nodes)
    copy_index = next(i for i, n in enumerate(nodes) if n.target is aten.copy_.default)
    assert late == [] and copy_index > next(i for i, n in enumerate(nodes) if n.target is aten.add.Tensor)
    x, c0 = torch.arange(4.0), torch.arange(4.0) + 10
    (y,) = module(x, c0)
    assert torch.equal(y, torch.tensor([20.0, 22.0])) and torch.equal(c0, x * 3)


def test_the_in_place_steady_step_is_built_once_per_graph():
    """`steady_in_place` (what the CUDA-graph capture and the compile-ahead pass both run) returns the same
    in-place step for the same steady graph, and a step whose graph copies every new cache into its input."""
    from rewrite.models.wan.steps import steady_in_place

    _, (_, steady) = tiny_wan("wan2.1")
    step, late = steady_in_place(steady)
    assert steady_in_place(steady)[0] is step and late == []
    nodes = step.graph_module.graph.nodes
    copies = [n for n in nodes if n.target is aten.copy_.default]
    written = sum(len(n.args[1]) for n in nodes if n.target is cache_into.write_next_caches_into)
    assert len(copies) + written == len(steady.user_input_names) - 1
    assert step.graph_module is not steady.graph_module


def test_static_caches_take_the_layout_the_steady_graph_returns():
    # `lossless`, where a layout change could change bits; `channels_last` has the same cache ops
    _, (chunk0, steady) = tiny_wan("wan2.1")
    rewrite_graph(steady, "lossless")
    rewrite_graph(chunk0, "lossless")
    names = steady.user_input_names
    formats = static_cache_formats(steady.graph_module, names)
    assert len(formats) == len(names) - 1
    new = list(next(n for n in steady.graph_module.graph.nodes if n.op == "output").args[0])[1:]
    first = list(next(n for n in chunk0.graph_module.graph.nodes if n.op == "output").args[0])[1:]
    cl = torch.channels_last_3d
    for fmt, value in zip(formats, new):
        if fmt is not None:  # returned channels-last by the steady step
            assert value.meta["val"].is_contiguous(memory_format=cl) and not value.meta["val"].is_contiguous()
    # the time_conv caches: chunk 0 returns them contiguous, the steady step channels-last; their buffers follow
    # the steady step, so that its copy into them is a memcpy
    crossing = [i for i, (value, chunk0_value) in enumerate(zip(new, first))
                if chunk0_value.meta["val"].is_contiguous() and not value.meta["val"].is_contiguous()]
    assert crossing and all(formats[i] is cl for i in crossing)


def test_a_cache_read_by_an_aten_op_keeps_its_layout():
    graph = fx.Graph()
    x, c0 = graph.placeholder("x"), graph.placeholder("c0")
    y = graph.call_function(aten.add.Tensor, (x, c0))  # ATen reads the cache: its strides may matter
    new = graph.call_function(aten.mul.Tensor, (x, 2))
    new.meta["val"] = torch.empty((1, 4, 2, 3, 3), memory_format=torch.channels_last_3d)
    graph.output((y, new))
    assert static_cache_formats(fx.GraphModule(torch.nn.Module(), graph), ["x", "c0"]) == [None]


@pytest.mark.parametrize("size_reader,expected", [
    (aten.sym_size.int, torch.channels_last_3d),  # sizes alone: the layout is free
    (aten.sym_stride.int, None),                   # strides: the buffer's layout would change what it reads
])
def test_a_cache_whose_sizes_are_read_follows_the_steady_graph(size_reader, expected):
    """A symbolic graph reads a cache input's sizes for its shape arithmetic (the encoder's steps do): that reader
    leaves the buffer free to take the steady step's channels-last layout, a stride reader does not."""
    graph = fx.Graph()
    x, c0 = graph.placeholder("x"), graph.placeholder("c0")
    graph.call_function(size_reader, (c0, 3))
    y = graph.call_function(torch.ops.rewrite.rms_norm.default, (x, c0))  # a rewrite op reads the cache
    new = graph.call_function(aten.mul.Tensor, (x, 2))
    new.meta["val"] = torch.empty((1, 4, 2, 3, 3), memory_format=torch.channels_last_3d)
    graph.output((y, new))
    assert static_cache_formats(fx.GraphModule(torch.nn.Module(), graph), ["x", "c0"]) == [expected]


def test_the_encoders_static_caches_take_the_layout_its_steady_graph_returns(monkeypatch):
    """Wan 2.1's tiny encoder at ``channels_last`` (the channels-last conv paths taken as on a GPU): every cache its
    steady step returns channels-last gets a channels-last buffer, so no step copies a cache across layouts (on
    the H100 such copies were 15% of a 720p encode's kernel time: docs/tuning.md 1.22)."""
    from rewrite.models.wan.config import build_wan
    from rewrite.models.wan.encoder_capture import capture_wan_encoder
    from rewrite.ops import dispatch, selftest

    monkeypatch.setattr(dispatch, "INTERPRETING", True)
    monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *a, **k: True)
    vae = build_wan("wan2.1", "tiny").to(torch.bfloat16)
    steady = [g for g in capture_wan_encoder(vae.encoder, torch.bfloat16, torch.device("cpu")) if "steady" in g.name][0]
    rewrite_graph(steady, "channels_last")
    formats = static_cache_formats(steady.graph_module, steady.user_input_names)
    new = list(next(n for n in steady.graph_module.graph.nodes if n.op == "output").args[0])[1:]
    returned_channels_last = [not v.meta["val"].is_contiguous() for v in new]
    assert sum(returned_channels_last) >= 10
    assert [f is torch.channels_last_3d for f in formats] == returned_channels_last
