"""Find where a pattern occurs in an exported graph, and explain where it nearly did.

Design
------
Input graphs come from ``torch.export.export(strict=False)`` (pre-dispatch aten, not decomposed) after
``canonicalize``: ``call_function`` nodes with ``torch.ops.aten.*`` overload targets, ``meta['val']`` and
``meta['nn_module_stack']``. A pattern (``rewrite.engine.pattern``) is traced to the same form, with one
placeholder per parameter of its ``search`` function.

1. Structure. ``torch.fx``'s ``SubgraphMatcher`` walks backwards from each pattern sink over every graph
   node with the sink's op (each arg has exactly one producer, so the walk is deterministic), backtracks
   over the combinations when the pattern has several sinks, normalises positional/keyword layouts through
   the op schema, and drops regions that would form a cycle if fused (non-convex). It is subclassed so
   that a *literal placeholder* (``Pattern.scalars``) matches only a literal and binds its value (it also
   binds a literal inside a list, e.g. a dim), while a tensor placeholder matches only a node. Literals
   written in ``search`` (``1e-12``, ``[1]``) must be equal, of the same type.
2. Checks, each rejection kept with its reason, in this order: containment (a matched node may have users
   outside the match only if it is one of the pattern's outputs: that is what makes multi-output patterns
   safe), in-place safety (an in-place op in the match may not write into an input that other nodes read),
   the pattern's guard (``"guard failed: ..."``), and overlap (matches are disjoint; the first in graph
   order wins).
3. Near misses, only when asked (``MatchResult.near_misses()``): from every graph node whose op is the
   pattern's anchor op (then, so that a graph without that op still gets an answer, the other ops of the
   pattern, sinks first), grow a partial match forwards and backwards and record the first divergence:
   the graph node, what the pattern expected there and what was found. The candidate that matched the
   most pattern ops is the near miss; a complete structural match explains itself by its rejection.

Exactness: matching never changes the graph. Limitations: two tensor placeholders never bind the same graph
node (SubgraphMatcher keeps the mapping injective); in-place safety is conservative (any other reader of a
written input rejects the match, before or after the write).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.utils.fuser_utils import validate_partition
from torch.fx.passes.utils.matcher_utils import InternalMatch, SubgraphMatcher

from rewrite.engine.pattern import SCALAR_META, Pattern

# --------------------------------------------------------------------------------------------- records


def describe_target(node: fx.Node) -> str:
    """``aten.silu.default`` for an op, ``placeholder x`` / ``get_attr w`` for the others."""
    if node.op == "call_function":
        return str(node.target) if isinstance(node.target, torch._ops.OpOverload) else getattr(
            node.target, "__name__", str(node.target))
    return f"{node.op} {node.target}"


def _module_type_name(module_type: Any) -> str:
    return module_type if isinstance(module_type, str) else f"{module_type.__module__}.{module_type.__qualname__}"


#: class name -> the name patterns' ``module_types`` know it by, for a model family whose classes are another's under
#: other names (filled by that family when it loads, e.g. ``rewrite.models.qwenimage.runner``)
MODULE_TYPE_ALIASES: dict[str, str] = {}


def module_type_names(qual: str) -> tuple[str, ...]:
    """The names a class qualname answers to in ``module_types``: itself, its last component, that one's alias."""
    short = qual.rsplit(".", 1)[-1]
    alias = MODULE_TYPE_ALIASES.get(short)
    return (qual, short) if alias is None else (qual, short, alias)


def module_stack(node: fx.Node) -> list[tuple[str, str]]:
    """``(module path, class qualname)`` from the root module to the innermost, from ``nn_module_stack``."""
    return [(path, _module_type_name(cls)) for path, cls in (node.meta.get("nn_module_stack") or {}).values()]


def module_path(node: fx.Node) -> str:
    stack = module_stack(node)
    return (stack[-1][0] or "<root>") if stack else "<no module>"


def _where(node: fx.Node) -> str:
    return f"node {node.name} ({describe_target(node)}, from {module_path(node)})"


@dataclasses.dataclass(eq=False)
class Match:
    """One occurrence of a pattern: which graph nodes, what they bound, where they came from."""

    pattern: Pattern
    nodes: dict[fx.Node, fx.Node]  # pattern op node -> graph node
    inputs: dict[str, fx.Node]  # tensor parameter -> graph node
    scalars: dict[str, Any]  # literal parameter -> bound value
    outputs: tuple[fx.Node, ...]  # graph nodes of the pattern's return values, in order
    module_path: str  # deepest module common to all matched nodes ("" is the root)
    module_type: str  # its class qualname

    @property
    def anchor(self) -> fx.Node:
        """The graph node of the pattern's first return value (provenance donor for new nodes)."""
        return self.outputs[0]

    @property
    def graph_nodes(self) -> list[fx.Node]:
        return list(self.nodes.values())

    def cross_check(self) -> bool:
        """Whether a matched node came from a module of a class named in ``pattern.module_types``.

        True when the pattern names no module types. Class names compare by qualname, its last component or that one's alias (`module_type_names`).
        """
        expected = set(self.pattern.module_types)
        if not expected:
            return True
        seen = {name for node in self.graph_nodes for _, qual in module_stack(node) for name in module_type_names(qual)}
        return bool(expected & seen)

    def __repr__(self) -> str:
        return (f"Match({self.pattern.name} at {self.anchor.name}, module {self.module_path or '<root>'} "
                f"({self.module_type}), scalars={self.scalars})")


@dataclasses.dataclass(eq=False)
class Rejection:
    """A structural match that was dropped, and why."""

    match: Match
    reason: str


@dataclasses.dataclass(eq=False)
class NearMiss:
    """The closest a candidate came to matching: where it diverged and what the pattern expected there."""

    pattern: Pattern
    anchor: fx.Node  # the graph node the attempt started from
    matched_count: int  # pattern ops matched
    diverged_at: fx.Node | None
    expected: str
    found: str
    reason: str


@dataclasses.dataclass(eq=False)
class MatchResult:
    """Accepted matches (disjoint, graph order) and rejections; near misses are computed on demand.

    Valid until the graph is changed (near misses are computed against the graph as it is when asked).
    """

    pattern: Pattern
    gm: fx.GraphModule
    matches: list[Match]
    rejected: list[Rejection]
    _near: list[NearMiss] | None = dataclasses.field(default=None, repr=False)

    def near_misses(self) -> list[NearMiss]:
        """All candidates that did not become matches, closest first."""
        if self._near is None:
            self._near = _near_misses(self)
        return self._near

    def near_miss(self) -> NearMiss | None:
        """The closest candidate, or None when every candidate matched (or there is none)."""
        misses = self.near_misses()
        return misses[0] if misses else None


# --------------------------------------------------------------------------------------------- structure


def _is_literal_placeholder(node: fx.Node) -> bool:
    return node.op == "placeholder" and bool(node.meta.get(SCALAR_META))


class _LiteralPlaceholderMatcher(SubgraphMatcher):
    """SubgraphMatcher where literal placeholders bind literals only and tensor placeholders nodes only.

    Containment is left to ``_containment_reason`` so that a rejection carries its reason.
    """

    def __init__(self, pattern_graph: fx.Graph) -> None:
        super().__init__(pattern_graph, match_output=False, match_placeholder=False,
                         remove_overlapping_matches=False, ignore_literals=False)
        self._anchor_candidates: dict[fx.Node, set[fx.Node]] | None = None

    def match(self, graph: fx.Graph, node_name_match: str = "") -> list[InternalMatch]:
        """SubgraphMatcher's matches. For a pattern of several outputs its backtracking tries, for every partial
        match of the earlier anchors, every candidate of the next one; the later anchors' candidates are first
        cut to the nodes each matches alone (a necessary condition: the same matches, in the same order)."""
        self._anchor_candidates = None
        if len(self.pattern_anchors) > 1:
            candidates = {}
            for anchor in self.pattern_anchors[1:]:
                candidates[anchor] = {gn for gn in graph.nodes if self._nodes_are_equal(anchor, gn, node_name_match)
                                      and self._match_nodes(anchor, gn, InternalMatch(anchors=self.pattern_anchors),
                                                            node_name_match)}
            if not all(candidates.values()):  # (SubgraphMatcher would drop the anchor, then fail: see find_matches)
                return []
            self._anchor_candidates = candidates
        try:
            return super().match(graph, node_name_match)
        finally:
            self._anchor_candidates = None

    def _nodes_are_equal(self, pn: fx.Node, gn: fx.Node, node_name_match: str = "") -> bool:
        if _is_literal_placeholder(pn):
            return False
        if self._anchor_candidates is not None and pn in self._anchor_candidates:
            return gn in self._anchor_candidates[pn]
        return super()._nodes_are_equal(pn, gn, node_name_match)

    def _match_literals(self, pn: Any, gn: Any, match: InternalMatch) -> bool:
        if isinstance(pn, fx.Node) and pn.op == "placeholder" and not _is_literal_placeholder(pn):
            return False
        return super()._match_literals(pn, gn, match)

    def _is_contained(self, nodes_map: dict[fx.Node, fx.Node]) -> bool:
        return True


def _pattern_outputs(pattern: Pattern) -> tuple[fx.Node, ...]:
    return tuple(pattern.search_graph.output_node().args[0])


def _common_module(nodes: list[fx.Node]) -> tuple[str, str]:
    stacks = [module_stack(n) for n in nodes]
    common: list[tuple[str, str]] = []
    for entries in zip(*stacks):
        if any(e != entries[0] for e in entries):
            break
        common.append(entries[0])
    return common[-1] if common else ("", "")


def _to_match(pattern: Pattern, found: InternalMatch) -> Match:
    nodes, inputs, scalars = {}, {}, {}
    for pn, gn in found.nodes_map.items():
        if pn.op == "call_function":
            nodes[pn] = gn
        elif _is_literal_placeholder(pn):
            scalars[pn.target] = gn
        elif pn.op == "placeholder":
            inputs[pn.target] = gn
    path, cls = _common_module(list(nodes.values()))
    outputs = tuple(found.nodes_map[pn] for pn in _pattern_outputs(pattern))
    return Match(pattern, nodes, inputs, scalars, outputs, path, cls)


def _containment_reason(match: Match) -> str | None:
    inside = set(match.graph_nodes)
    returned = set(_pattern_outputs(match.pattern))
    for pn, gn in match.nodes.items():
        if pn in returned:
            continue
        outside = [u.name for u in gn.users if u not in inside]
        if outside:
            return (f"{_where(gn)} is internal to the pattern but also feeds {', '.join(outside)} "
                    "outside the match (only pattern outputs may)")
    return None


def _written_args(node: fx.Node) -> list[Any]:
    """The arguments an op writes into (schema arguments with a write alias, e.g. ``self`` of ``add_``)."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return []
    written = []
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written.append(node.kwargs[arg.name] if arg.name in node.kwargs else
                           node.args[i] if i < len(node.args) else None)
    return written


def _inplace_reason(match: Match) -> str | None:
    inside = set(match.graph_nodes)
    for gn in match.graph_nodes:
        for target in _written_args(gn):
            if isinstance(target, fx.Node) and target not in inside:
                readers = [u.name for u in target.users if u not in inside]
                if readers:
                    return (f"{_where(gn)} writes into input {target.name}, which {', '.join(readers)} "
                            "also read; the out-of-place replacement would change what they see")
    return None


def find_matches(gm: fx.GraphModule, pattern: Pattern) -> MatchResult:
    """All disjoint, checked matches of ``pattern`` in ``gm`` (graph order), with the rejections."""
    matcher = _LiteralPlaceholderMatcher(pattern.search_graph)
    # SubgraphMatcher silently drops an anchor without candidates and then fails on a KeyError while
    # assembling the returned nodes: a graph lacking any anchor's op cannot match at all.
    if any(not any(matcher._nodes_are_equal(anchor, node) for node in gm.graph.nodes)
           for anchor in matcher.pattern_anchors):
        return MatchResult(pattern, gm, [], [])
    found = matcher.match(gm.graph)
    matches: list[Match] = []
    rejected: list[Rejection] = []
    owner: dict[fx.Node, Match] = {}
    for internal in found:
        match = _to_match(pattern, internal)
        reason = _containment_reason(match) or _inplace_reason(match)
        if reason is None and pattern.guard is not None:
            guard_reason = pattern.guard(match)
            reason = f"guard failed: {guard_reason}" if guard_reason is not None else None
        if reason is None:
            earlier = next((owner[n] for n in match.graph_nodes if n in owner), None)
            if earlier is not None:
                reason = f"overlaps the earlier match at {earlier.anchor.name}"
        if reason is not None:
            rejected.append(Rejection(match, reason))
            continue
        matches.append(match)
        owner.update((n, match) for n in match.graph_nodes)
    return MatchResult(pattern, gm, matches, rejected)


# --------------------------------------------------------------------------------------------- near misses


def _aligned_args(pn: fx.Node, gn: fx.Node) -> tuple[list[Any], list[Any]] | None:
    """Arguments of both nodes side by side (filled from the schema when the layouts differ)."""
    if len(pn.args) == len(gn.args) and list(pn.kwargs) == list(gn.kwargs):
        return [*pn.args, *pn.kwargs.values()], [*gn.args, *gn.kwargs.values()]
    if not isinstance(pn.target, torch._ops.OpOverload):
        return None
    schema = pn.target._schema.arguments

    def full(node: fx.Node) -> list[Any]:
        return [node.kwargs[a.name] if a.name in node.kwargs else
                node.args[i] if not a.kwarg_only and i < len(node.args) else a.default_value
                for i, a in enumerate(schema)]

    return full(pn), full(gn)


class _Growth:
    """A partial match grown from one (pattern op, graph node) seed; keeps the first divergence."""

    def __init__(self, seed_pn: fx.Node, seed_gn: fx.Node) -> None:
        self.mapped: dict[fx.Node, fx.Node] = {seed_pn: seed_gn}
        self.used: set[fx.Node] = {seed_gn}
        self.bound: dict[fx.Node, Any] = {}
        self.failure: tuple[fx.Node, str, str, str] | None = None  # (at, expected, found, note)
        self.queue = collections.deque([seed_pn])
        while self.queue:
            pn = self.queue.popleft()
            gn = self.mapped[pn] if pn in self.mapped else self.bound[pn]
            if pn.op == "call_function":
                self._backward(pn, gn)
            self._forward(pn, gn)

    def _fail(self, at: fx.Node, expected: str, found: str, note: str = "") -> None:
        if self.failure is None:
            self.failure = (at, expected, found, note)

    def _backward(self, pn: fx.Node, gn: fx.Node) -> None:
        aligned = _aligned_args(pn, gn)
        if aligned is None:
            self._fail(gn, f"arguments {pn.args} {pn.kwargs}", f"{gn.args} {gn.kwargs}")
            return
        for pa, ga in zip(*aligned):
            self._compare(pa, ga, gn)

    def _compare(self, pa: Any, ga: Any, at: fx.Node) -> None:
        if isinstance(pa, fx.Node) and pa.op == "placeholder":
            self._bind(pa, ga, at)
        elif isinstance(pa, fx.Node):
            if not isinstance(ga, fx.Node):
                self._fail(at, describe_target(pa), f"literal {ga!r}")
            elif pa in self.mapped:
                if self.mapped[pa] is not ga:
                    self._fail(at, f"{describe_target(pa)} node {self.mapped[pa].name}", f"node {ga.name}")
            elif ga.op != "call_function" or ga.target != pa.target:
                self._fail(ga, describe_target(pa), describe_target(ga))
            elif ga in self.used:
                self._fail(ga, describe_target(pa), "a node already matched to another pattern op")
            else:
                self.mapped[pa] = ga
                self.used.add(ga)
                self.queue.append(pa)
        elif isinstance(pa, (list, tuple)):
            if isinstance(ga, (list, tuple)) and len(ga) == len(pa):
                for p, g in zip(pa, ga):
                    self._compare(p, g, at)
            else:
                self._fail(at, f"literal {pa!r}", f"node {ga.name}" if isinstance(ga, fx.Node) else f"literal {ga!r}")
        elif isinstance(ga, fx.Node):
            self._fail(at, f"literal {pa!r}", f"node {ga.name}")
        elif type(pa) is not type(ga) or pa != ga:
            self._fail(at, f"literal {pa!r}", f"literal {ga!r}")

    def _bind(self, pa: fx.Node, ga: Any, at: fx.Node) -> None:
        literal = _is_literal_placeholder(pa)
        if literal and isinstance(ga, fx.Node):
            self._fail(at, f"literal placeholder {pa.target}", f"node {ga.name} ({describe_target(ga)})")
        elif not literal and not isinstance(ga, fx.Node):
            self._fail(at, f"a node for input {pa.target}", f"literal {ga!r}")
        elif pa in self.bound:
            same = self.bound[pa] is ga if not literal else self.bound[pa] == ga
            if not same:
                self._fail(at, f"{pa.target} = {self.bound[pa]!r}", repr(ga))
        else:
            self.bound[pa] = ga
            if not literal:
                self.queue.append(pa)

    def _forward(self, pn: fx.Node, gn: fx.Node) -> None:
        for pu in pn.users:
            if pu.op == "output" or pu in self.mapped:
                continue
            candidates = [u for u in gn.users if u.op == "call_function" and u.target == pu.target
                          and u not in self.used]
            if candidates:
                self.mapped[pu] = candidates[0]
                self.used.add(candidates[0])
                self.queue.append(pu)
            else:
                found = ", ".join(sorted({describe_target(u) for u in gn.users})) or "no users"
                self._fail(gn, describe_target(pu), found, f" among the users of {gn.name}")

    def ops_matched(self) -> int:
        return sum(1 for pn in self.mapped if pn.op == "call_function")


def _complete_reason(result: MatchResult, growth: _Growth) -> tuple[fx.Node, str]:
    """Why a structurally complete candidate is not a match: its rejection, else what dropped it."""
    nodes = set(growth.mapped.values())
    for rejection in result.rejected:
        if set(rejection.match.graph_nodes) == nodes:
            return rejection.match.anchor, rejection.reason
    inputs = [g for p, g in growth.bound.items() if not _is_literal_placeholder(p)]
    if len(set(inputs)) != len(inputs):
        return next(iter(nodes)), "two tensor inputs of the pattern are the same graph node"
    if not validate_partition(list(nodes)):
        return next(iter(nodes)), "fusing the matched nodes would form a cycle (the region is not convex)"
    return next(iter(nodes)), "complete structure but not found by the matcher"


def _near_misses(result: MatchResult) -> list[NearMiss]:
    pattern, graph = result.pattern, result.gm.graph
    calls = [n for n in pattern.search_graph.nodes if n.op == "call_function"]
    sinks = list(_pattern_outputs(pattern))
    seeds = sinks + [n for n in reversed(calls) if n not in sinks]
    covered = {n for m in result.matches for n in m.graph_nodes}
    misses: list[NearMiss] = []
    for pn in seeds:
        for gn in graph.nodes:
            if gn.op != "call_function" or gn.target != pn.target or gn in covered:
                continue
            growth = _Growth(pn, gn)
            covered |= growth.used
            count = growth.ops_matched()
            if growth.failure is not None:
                at, expected, found, note = growth.failure
                reason = f"at {_where(at)}: expected {expected} but found {found}{note}"
            elif count < len(calls):
                missing = [describe_target(p) for p in calls if p not in growth.mapped]
                at, expected, found = gn, ", ".join(missing), "no path to them"
                reason = f"from {_where(gn)}: pattern ops {expected} were never reached"
            else:
                at, reason = _complete_reason(result, growth)
                expected, found = "a usable match", reason
                reason = f"at {_where(at)}: {reason}"
            misses.append(NearMiss(pattern, gn, count, at, expected, found,
                                   f"{pattern.name}: matched {count}/{len(calls)} ops; {reason}"))
    misses.sort(key=lambda m: -m.matched_count)
    return misses
