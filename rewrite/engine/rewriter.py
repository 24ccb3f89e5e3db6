"""Replace matches by their pattern's traced replacement graph.

For each match: inline ``pattern.replace_graph`` right after the last matched node (placeholders bound to
the match's input nodes and literal values), give every new node ``meta['val']`` by running its op on the
input ``val``s under the graph's fake mode (``torch._guards.detect_fake_mode``; SymInt shapes carry
through), copy ``nn_module_stack`` and ``stack_trace`` from the match's anchor, tag it with
``meta['rewrite_pattern']``, reroute the users of each pattern output that lie outside the match, and erase
the matched nodes. A replacement output whose dtype, rank or (statically known) shape differs from the
node it replaces is an error: a replacement must be a drop-in.

Exactness: as declared by each pattern; the rewriter itself only moves edges. Preconditions: matches come
from ``find_matches`` on this graph, are disjoint, and the graph has not changed since. Ensures: the graph
lints (nodes are re-sorted, stably, only if a multi-output match had an outside user placed before its
last node) and the module is recompiled.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from typing import Any

import networkx as nx
import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import disable_fake_tensor_cache
from torch.fx.experimental.symbolic_shapes import statically_known_false

from rewrite.engine.matcher import Match

PATTERN_META = "rewrite_pattern"
PROVENANCE_META = ("nn_module_stack", "stack_trace")


class RewriteError(RuntimeError):
    """A replacement could not be inlined (missing ``val``, incompatible output, stale match)."""


@dataclasses.dataclass
class RewriteCounts:
    replaced: dict[str, int] = dataclasses.field(default_factory=dict)  # pattern name -> matches replaced
    nodes_added: int = 0
    nodes_erased: int = 0

    @property
    def total(self) -> int:
        return sum(self.replaced.values())


def _val(arg: Any, pattern: str) -> Any:
    if not isinstance(arg, fx.Node):
        return arg
    if "val" not in arg.meta:
        raise RewriteError(f"{pattern}: input {arg.name} has no meta['val']; run fake-tensor propagation first")
    return arg.meta["val"]


def fake_value(node: fx.Node, fake_mode: Any, pattern: str) -> Any:
    """The node's value on its inputs' fakes. Without the fake mode's dispatch cache: with symbolic sizes
    nearly every call misses, and a miss still builds and checks an entry (the passes run faster without it,
    giving the same values: docs/tuning.md section 5, "The pattern engine")."""
    args, kwargs = fx.node.map_aggregate((node.args, node.kwargs), lambda a: _val(a, pattern))
    with fake_mode, disable_fake_tensor_cache(fake_mode), torch.no_grad():
        return node.target(*args, **kwargs)


def _check_drop_in(old: fx.Node, new: Any, pattern: str) -> None:
    old_val = old.meta.get("val")
    new_val = new.meta.get("val") if isinstance(new, fx.Node) else None
    if not isinstance(old_val, torch.Tensor) or not isinstance(new_val, torch.Tensor):
        return
    mismatch = old_val.dtype != new_val.dtype or old_val.dim() != new_val.dim() or any(
        statically_known_false(a == b) for a, b in zip(old_val.shape, new_val.shape))
    if mismatch:
        raise RewriteError(f"{pattern}: replacement for {old.name} gives {new_val.dtype}{tuple(new_val.shape)}, "
                           f"the graph had {old_val.dtype}{tuple(old_val.shape)}")


def _inline(graph: fx.Graph, match: Match, after: fx.Node,
            forwarded: dict[fx.Node, Any]) -> tuple[list[Any], list[fx.Node]]:
    """Insert the replacement after ``after``; return its outputs (nodes or inputs) and the new nodes.

    ``forwarded`` maps outputs of matches replaced earlier to their replacements: a later match may have
    bound one of them as an input.
    """
    pattern = match.pattern
    bindings = {**{k: forwarded.get(n, n) for k, n in match.inputs.items()}, **match.scalars}
    env: dict[fx.Node, Any] = {}
    created: list[fx.Node] = []
    fake_mode = detect_fake_mode([_val(bindings[k], pattern.name) for k in match.inputs])
    if fake_mode is None:
        raise RewriteError(f"{pattern.name}: no FakeTensor among the inputs' meta['val']")
    with graph.inserting_after(after):
        for pn in pattern.replace_graph.nodes:
            if pn.op == "placeholder":
                env[pn] = bindings[pn.target]
            elif pn.op == "call_function":
                args, kwargs = fx.node.map_arg((pn.args, pn.kwargs), lambda n: env[n])
                node = graph.call_function(pn.target, args, kwargs)
                node.meta["val"] = fake_value(node, fake_mode, pattern.name)
                for key in PROVENANCE_META:
                    if key in match.anchor.meta:
                        node.meta[key] = match.anchor.meta[key]
                node.meta[PATTERN_META] = pattern.name
                env[pn] = node
                created.append(node)
    outputs = [env[o] if isinstance(o, fx.Node) else o for o in pattern.replace_graph.output_node().args[0]]
    return outputs, created


def _replace_one(graph: fx.Graph, match: Match, position: dict[fx.Node, int],
                 forwarded: dict[fx.Node, Any]) -> tuple[int, int]:
    matched = set(match.graph_nodes)
    last = max(matched, key=position.__getitem__)
    outputs, created = _inline(graph, match, last, forwarded)
    for old, new in zip(match.outputs, outputs):
        _check_drop_in(old, new, match.pattern.name)
        forwarded[old] = new
        old.replace_all_uses_with(new, delete_user_cb=lambda user: user not in matched)
    for node in sorted(matched, key=position.__getitem__, reverse=True):
        if node.users:
            raise RewriteError(f"{match.pattern.name}: {node.name} still has users {list(node.users)} after "
                               "rerouting; the match was not contained")
        graph.erase_node(node)
    return len(created), len(matched)


def _misordered(graph: fx.Graph) -> bool:
    seen: set[fx.Node] = set()
    for node in graph.nodes:
        if any(arg not in seen for arg in node.all_input_nodes):
            return True
        seen.add(node)
    return False


def _stable_topological_order(graph: fx.Graph) -> None:
    """Re-sort nodes by data dependencies, keeping the current order wherever it is already valid."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    deps = nx.DiGraph()
    deps.add_nodes_from(position)
    deps.add_edges_from((arg, node) for node in position for arg in node.all_input_nodes)
    order = list(nx.lexicographical_topological_sort(deps, key=position.__getitem__))
    for previous, node in zip(order, order[1:]):
        previous.append(node)


def replace_matches(gm: fx.GraphModule, matches: Iterable[Match], recompile: bool = True) -> RewriteCounts:
    """Replace every match in ``gm`` (disjoint, from ``find_matches`` on this graph); return the counts.
    ``recompile=False`` leaves ``gm``'s code stale for a caller that edits the graph further and recompiles
    once (matching reads the graph, not the code)."""
    graph = gm.graph
    counts = RewriteCounts()
    replaced: collections.Counter[str] = collections.Counter()
    erased: set[fx.Node] = set()
    forwarded: dict[fx.Node, Any] = {}
    position = {n: i for i, n in enumerate(graph.nodes)}
    for match in matches:
        stale = [n.name for n in match.graph_nodes if n in erased or n not in position]
        if stale:
            raise RewriteError(f"{match.pattern.name}: match refers to nodes no longer in the graph: {stale}")
        added, removed = _replace_one(graph, match, position, forwarded)
        erased.update(match.graph_nodes)
        counts.nodes_added += added
        counts.nodes_erased += removed
        replaced[match.pattern.name] += 1
    counts.replaced = dict(replaced)
    if replaced:
        if _misordered(graph):
            _stable_topological_order(graph)
        graph.lint()
        if recompile:
            gm.recompile()
    return counts
