"""`rewrite.models.wan.conv_weights`: channels-last weight copies for the channels-last conv ops.

Structural: which weight placeholders of the tiny Wan graphs (captured and rewritten at `lossless` on the CPU)
are substituted. Behavioural: copies are made once per weight, refreshed from in-place updates and dropped
with their weight. Numeric: the graphs run with the copies are `torch.equal` to the graphs run with the
module's own weights (the ops' reference paths make the weight contiguous again).
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch._library.custom_ops import OPDEFS
from torch.utils._python_dispatch import TorchDispatchMode

from rewrite.pipeline import rewrite_graph
from rewrite.ops import op_info
from rewrite.ops.dispatch import INTERPRETING
from rewrite.models.wan.conv_weights import ChannelsLastWeights, channels_last_weight_slots
from tests import quick
from tests.captures import tiny_wan
from tests.op_cases import CASES, grid_group, kernel_gates_open

aten = torch.ops.aten

# the ops' own declaration (`rewrite.ops.op_info`), as str(node.target) spells them
CHANNELS_LAST_OPS = {name.replace("::", ".") + ".default" for name in op_info.channels_last_weight_ops()}


@pytest.fixture(scope="module", params=["wan2.1", "wan2.2"])
def tiny_graphs(request):
    vae, graphs = tiny_wan(request.param)
    for graph in graphs:
        rewrite_graph(graph, "lossless")
    return vae, graphs


def test_slots_are_exactly_the_weights_only_channels_last_ops_read(tiny_graphs):
    _, graphs = tiny_graphs
    for graph in graphs:
        placeholders = [n for n in graph.graph_module.graph.nodes if n.op == "placeholder"]
        slots = set(channels_last_weight_slots(graph.graph_module))
        assert slots, graph.name
        for index, node in enumerate(placeholders):
            only_cl_weight = bool(node.users) and all(
                str(u.target) in CHANNELS_LAST_OPS and _reads_as_weight(u, node)
                and sum(a is node for a in (*u.args, *u.kwargs.values())) == 1 for u in node.users)
            assert (index in slots) == only_cl_weight, (graph.name, node.name)
        kinds = {graph.input_kinds[i][0] for i in slots}
        assert kinds == {"param"}


def _reads_as_weight(node, placeholder):
    """`placeholder` is one of the declared weight arguments of `node` (by position or keyword)."""
    return any(node.kwargs.get(name, node.args[index] if index < len(node.args) else None) is placeholder
               for index, name in op_info.channels_last_weight_arguments(node.target))


def test_a_weight_also_read_elsewhere_is_not_substituted():
    vae, (_, steady) = tiny_wan("wan2.1")
    rewrite_graph(steady, "lossless")
    gm = steady.graph_module
    slot = channels_last_weight_slots(gm)[0]
    placeholder = [n for n in gm.graph.nodes if n.op == "placeholder"][slot]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        extra = gm.graph.call_function(torch.ops.aten.sum.default, (placeholder,))
    assert slot not in channels_last_weight_slots(gm)
    gm.graph.erase_node(extra)
    assert slot in channels_last_weight_slots(gm)


def test_store_copies_once_refreshes_and_forgets_dead_weights():
    store = ChannelsLastWeights()
    conv3d = torch.randn(4, 3, 3, 3, 3)
    conv2d = torch.randn(4, 3, 3, 3)
    bias = torch.randn(4)
    weights = [None, conv3d, conv2d, bias]
    out, pairs = store.substitute([1, 2, 3], weights)
    assert out[0] is None and out[3] is bias  # not a conv weight: passed as is
    assert out[1].is_contiguous(memory_format=torch.channels_last_3d) and torch.equal(out[1], conv3d)
    assert out[2].is_contiguous(memory_format=torch.channels_last) and torch.equal(out[2], conv2d)
    assert len(store) == 2 and len(pairs) == 2
    again, _ = store.substitute([1], weights)
    assert again[1] is out[1]  # one copy per weight, shared by every graph that reads it
    conv3d.mul_(2)
    assert not torch.equal(out[1], conv3d)
    store.refresh(pairs)
    assert torch.equal(out[1], conv3d)
    del weights, conv2d, again, out, pairs
    gc.collect()
    store.substitute([0], [conv3d])
    assert len(store) == 1
    assert len(copy.deepcopy(store)) == 0


def test_graphs_run_with_the_copies_are_equal_to_the_graphs_run_with_the_weights(tiny_graphs):
    vae, (chunk0, steady) = tiny_graphs
    store = ChannelsLastWeights()
    generator = torch.Generator().manual_seed(0)
    x0 = torch.randn(1, vae.config.z_dim, 1, 4, 6, generator=generator)
    x1 = torch.randn(1, vae.config.z_dim, 1, 4, 6, generator=generator)
    weights0, weights = chunk0.weights(vae.decoder), steady.weights(vae.decoder)
    cl0, _ = store.substitute(channels_last_weight_slots(chunk0.graph_module), weights0)
    cl, _ = store.substitute(channels_last_weight_slots(steady.graph_module), weights)
    with torch.no_grad():
        y0, *caches = chunk0(weights0, x0)
        z0, *caches_cl = chunk0(cl0, x0)
        y1, *_ = steady(weights, x1, *caches)
        z1, *_ = steady(cl, x1, *caches_cl)
    assert torch.equal(y0, z0) and torch.equal(y1, z1)
    assert all(torch.equal(a, b) for a, b in zip(caches, caches_cl))


# ---- which ops read channels-last weights: declared with the op, checked against what the op does ---------------
class _CopiesOf(TorchDispatchMode):
    """Counts the channels-last copies made of one tensor (a clone or a copy reading it whose result is in
    channels-last memory; a dtype conversion in the same layout, e.g. to sum weights in fp32, is no such copy)
    while active."""

    def __init__(self, tensor: torch.Tensor):
        super().__init__()
        self.tensor, self.count = tensor, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (aten.clone.default, aten._to_copy.default, aten.copy_.default) and any(
                a is self.tensor for a in args):
            result = args[0] if func is aten.copy_.default else out
            fmt = torch.channels_last_3d if result.dim() == 5 else torch.channels_last
            if result.dim() in (4, 5) and result.is_contiguous(memory_format=fmt) and not result.is_contiguous():
                self.count += 1
        return out


def _implementation(op: str):
    """The op's Python implementation, so that a dispatch mode sees the ATen calls inside it."""
    from rewrite.models.auk import alias_free

    opdef = OPDEFS.get(f"rewrite::{op}")
    return opdef._init_fn if opdef is not None else {"alias_free_snake_causal_conv1d": alias_free._snake_conv_impl}[op]


WEIGHT_CASES = [(op, case) for op, cases in CASES.items() for case in cases if case.weight is not None]


@pytest.mark.skipif(not INTERPRETING, reason="needs TRITON_INTERPRET=1 (the kernel paths on CPU)")
@pytest.mark.parametrize("op, case", quick.grid(WEIGHT_CASES, lambda v: grid_group(*v), 1, unpack=True,
                                                ids=lambda v: f"{v[0]}-{v[1].id}"))
def test_an_op_declares_a_channels_last_weight_exactly_when_its_kernel_path_converts_one(
        kernel_allowed_on_cpu, monkeypatch, op, case):
    """Declared ops copy the module's (contiguous) weight into channels-last memory on every call of their kernel
    path and copy nothing when given the channels-last copy, with the same result; other ops copy neither."""
    kernel_gates_open(monkeypatch)
    implementation, weight = _implementation(op), case.args[case.weight]
    with torch.no_grad(), _CopiesOf(weight) as copies:
        expected = implementation(*case.args)
    declared = f"rewrite::{op}" in op_info.channels_last_weight_ops()
    assert (copies.count > 0) == declared, f"{op}: {copies.count} copies of the weight, declared: {declared}"
    if declared:
        fmt = torch.channels_last_3d if weight.dim() == 5 else torch.channels_last
        copy_ = weight.contiguous(memory_format=fmt)
        args = (*case.args[:case.weight], copy_, *case.args[case.weight + 1:])
        with torch.no_grad(), _CopiesOf(copy_) as copies:
            actual = implementation(*args)
        assert copies.count == 0
        for a, e in zip(torch.utils._pytree.tree_leaves(actual), torch.utils._pytree.tree_leaves(expected)):
            assert torch.equal(a, e)
