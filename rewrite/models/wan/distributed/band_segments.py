"""CUDA graphs for the band graphs: each step graph replayed as captured segments between its collectives.

A band step graph (`rewrite.models.wan.distributed.band_graphs`) talks to the other ranks in its collective ops
(`band_ops.COLLECTIVES`: the halo row exchange, the attention's gather), which cannot sit inside a CUDA graph
over gloo (host staging) and are not relied on inside one over NCCL. So `split_at_collectives` cuts the graph
into compute segments (FX graph modules of the nodes between two collectives) and the collective calls, and
`SegmentedStep` captures every compute segment as a CUDA graph and runs the collectives eagerly between the
replays, copying what they return into static buffers that the next segment's graph reads.

Memory: all segments of the two step graphs share one private pool and are captured in the order they replay,
so a segment may reuse the memory of a value that no later segment reads; the Python handle of such a value
is dropped right after the capture of its last reader (a handle that stayed would keep its memory). Handles
are kept only for what is read outside the graphs at replay time: the collectives' inputs (a halo's two rows,
the attention's input at latent resolution) and the step's outputs. The collectives' static outputs (rows,
and the gathered attention input) are plain allocations.

With NCCL a step may instead be captured whole, its collectives inside the graph (`cuda_graphs="whole"` of
`decode_sharded`: `SegmentedBandSteps` with no collectives to cut at), which the issue allows where NCCL
supports it and it measures faster; gloo cannot (it stages through host memory), so there it is refused.

Exactness: a replay runs the kernels of the eager segments on the same shapes (`rewrite.runtime.graphs`), and
the collectives copy the same values; `band_graphs` still compares the first replayed steps with the eager
band graphs before the replays serve alone.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Sequence

import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import map_arg

from rewrite.models.wan.distributed.band_ops import COLLECTIVES
from rewrite.runtime.graphs import CudaGraphBackend, StaticStep, static_buffer_mode


@dataclasses.dataclass
class Compute:
    """Nodes between two collectives as one graph module: reads `inputs`, returns `outputs` (parent nodes)."""

    module: GraphModule
    inputs: list[Node]
    outputs: list[Node]


@dataclasses.dataclass
class Collective:
    """One collective call of the parent graph, and the `getitem`s of its tuple."""

    node: Node
    items: list[Node]


@dataclasses.dataclass
class Split:
    placeholders: list[Node]
    pieces: list  # Compute and Collective, in graph order
    results: Any  # the output node's argument (nodes inside)


def split_at_collectives(gm: GraphModule, collectives=COLLECTIVES) -> Split:
    """`gm` cut before and after every call of one of `collectives`; a `getitem` goes with the node it reads.
    With no `collectives` the whole graph is one compute piece."""
    placeholders, output = [], None
    groups: list[tuple[str, list[Node]]] = []
    home: dict[Node, int] = {}
    current: list[Node] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            placeholders.append(node)
        elif node.op == "output":
            output = node
        elif node.op != "call_function":
            raise ValueError(f"split_at_collectives: {node.op} node {node.name} (only call_function is expected)")
        elif node.target is operator.getitem and isinstance(node.args[0], Node) and node.args[0] in home:
            index = home[node.args[0]]
            (current if index == len(groups) else groups[index][1]).append(node)
            home[node] = index
        elif node.target in collectives:
            if current:
                groups.append(("compute", current))
                current = []
            home[node] = len(groups)
            groups.append(("collective", [node]))
        else:
            home[node] = len(groups)
            current.append(node)
    if current:
        groups.append(("compute", current))
    pieces = [Collective(nodes[0], nodes[1:]) if kind == "collective" else _compute(nodes) for kind, nodes in groups]
    return Split(placeholders, pieces, output.args[0])


def _compute(nodes: list[Node]) -> Compute:
    inside = set(nodes)
    inputs: list[Node] = []
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in inside and arg not in inputs:
                inputs.append(arg)
    outputs = [n for n in nodes if any(user not in inside for user in n.users)]
    graph, env = Graph(), {}
    for arg in inputs:
        env[arg] = graph.placeholder(arg.name)
        env[arg].meta = dict(arg.meta)
    for node in nodes:
        env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(tuple(env[n] for n in outputs))
    return Compute(GraphModule(torch.nn.Module(), graph), inputs, outputs)


def _call_collective(piece: Collective, values: dict) -> list[torch.Tensor]:
    node = piece.node
    result = node.target(*map_arg(node.args, values.__getitem__), **map_arg(node.kwargs, values.__getitem__))
    return [result[item.args[1]] for item in piece.items] if piece.items else [result]


def run_split(split: Split, args: Sequence) -> list:
    """The split graph run eagerly: the same values as the graph module it came from."""
    values = dict(zip(split.placeholders, args))
    for piece in split.pieces:
        if isinstance(piece, Compute):
            values.update(zip(piece.outputs, piece.module(*[values[n] for n in piece.inputs])))
        else:
            values.update(zip(piece.items or [piece.node], _call_collective(piece, values)))
    return list(map_arg(split.results, values.__getitem__))


class CudaSegments:
    """Captures a segment as a CUDA graph (`rewrite.runtime.graphs.StaticStep`: warm-up on a side stream,
    capture alone among rewrite's work) and keeps no handle of its inputs or outputs; pools and
    `can_capture` are the runner's backend's."""

    can_capture = staticmethod(CudaGraphBackend.can_capture)
    new_pool = staticmethod(CudaGraphBackend.new_pool)

    @staticmethod
    def capture(fn: Callable, inputs: Sequence[torch.Tensor], pool) -> tuple[Callable[[], None], list[torch.Tensor]]:
        step = StaticStep(fn, inputs, pool=pool)
        outputs, step.inputs, step.outputs = step.outputs, [], []
        return step.graph.replay, outputs


class SegmentedStep:
    """One band step graph over static inputs (`args`, in placeholder order: weights, then the step's own
    static buffers), its compute segments captured into `pool` by `backend`; `replay()` runs it and returns the
    graph's outputs (static tensors, overwritten by the next replay of any step of the pool)."""

    def __init__(self, gm: GraphModule, args: Sequence, backend, pool, collectives=COLLECTIVES) -> None:
        split = split_at_collectives(gm, collectives)
        last_read: dict[Node, int] = {}
        for index, piece in enumerate(split.pieces):
            for node in (piece.inputs if isinstance(piece, Compute) else piece.node.all_input_nodes):
                last_read[node] = index
        results = set()
        map_arg(split.results, lambda n: results.add(n))
        kept = set(results)
        for piece in split.pieces:
            if isinstance(piece, Collective):
                kept.update(piece.node.all_input_nodes)
        values = dict(zip(split.placeholders, args))
        self.program: list = []
        with static_buffer_mode():
            for index, piece in enumerate(split.pieces):
                if isinstance(piece, Compute):
                    replay, outputs = backend.capture(piece.module, [values[n] for n in piece.inputs], pool)
                    values.update(zip(piece.outputs, outputs))
                    self.program.append(replay)
                else:
                    targets = piece.items or [piece.node]
                    buffers = [_empty_like_val(n.meta["val"]) for n in targets]
                    values.update(zip(targets, buffers))
                    self.program.append((piece, buffers))
                for node in [n for n in values if n not in kept and last_read.get(n, -1) <= index
                             and n not in split.placeholders]:
                    del values[node]  # its last reader is captured: its memory may serve later segments
        self.values = values  # placeholders, collective inputs and outputs, the step's results
        self.results = split.results

    def replay(self) -> list:
        for item in self.program:
            if callable(item):
                item()
            else:
                piece, buffers = item
                for buffer, value in zip(buffers, _call_collective(piece, self.values)):
                    buffer.copy_(value)
        return list(map_arg(self.results, self.values.__getitem__))


def _empty_like_val(val: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype, device=val.device)


class SegmentedBandSteps:
    """The chunk-0 and steady band graphs as `SegmentedStep`s over one static latent frame and static caches
    (shapes from the graphs' outputs), sharing one pool; `first(x)` / `next(x)` copy the frame in, replay, copy
    the new caches into the static ones and return the frames (static: copy what you keep). `collectives`:
    the ops the steps are cut at (none: each step is one captured graph, collectives inside)."""

    def __init__(self, chunk0, steady, weights0, weights, x_example: torch.Tensor, backend,
                 collectives=COLLECTIVES) -> None:
        self.collectives = tuple(collectives)
        self.weight_pointers = tuple(0 if w is None else w.data_ptr() for w in (*weights0, *weights))
        with static_buffer_mode():
            self.x = torch.zeros(x_example.shape, dtype=x_example.dtype, device=x_example.device)
            output = next(n for n in chunk0.graph_module.graph.nodes if n.op == "output")
            self.caches = [torch.zeros_like(_empty_like_val(n.meta["val"])) for n in output.args[0][1:]]
        pool = backend.new_pool()
        self._first = SegmentedStep(chunk0.graph_module, chunk0.bind(weights0, self.x), backend, pool,
                                    self.collectives)
        self._next = SegmentedStep(steady.graph_module, steady.bind(weights, self.x, *self.caches), backend, pool,
                                   self.collectives)

    def serves(self, weights0, weights) -> bool:
        """Whether the captured weights are still these tensors (not replaced, not moved)."""
        return self.weight_pointers == tuple(0 if w is None else w.data_ptr() for w in (*weights0, *weights))

    def _step(self, step: SegmentedStep, x: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x)
        y, *new = step.replay()
        for static, value in zip(self.caches, new):
            static.copy_(value)
        return y

    def first(self, x: torch.Tensor) -> torch.Tensor:
        return self._step(self._first, x)

    def next(self, x: torch.Tensor) -> torch.Tensor:
        return self._step(self._next, x)
