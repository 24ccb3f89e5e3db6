"""What the passes do to a captured graph, for people: which patterns match where, which do not apply and why.

`explain_graph` runs a level's own pipeline on a captured graph, observing ``fuse_patterns``
(``PassContext.match_observer``): the graph as the pass received it, each match before it is replaced
(nodes in pattern order with their inputs by name, shapes, dtypes, source module), the guard rejections,
near misses when asked, and which match created each node that a later, combining pattern matched (so a
`causal_conv3d` match says which `causal_conv_input` and `conv3d_residual` matches it combines). At level
``off`` no pass runs: `optimize` installs nothing there.

`not_applicable` says why a pattern cannot match these graphs, with one of four reasons: another level
(``needs --level X``), another model (``other model``: the graphs come from none of the module classes the
pattern names), another dtype (``dtype``: the search casts to a dtype other than the graph's and float32,
or upcasts to float32, a cast a float32 graph does not have) or another device (``needs CUDA``: no variant
of the family matched and its guard rejected a candidate naming the graph's device).

Symbolic sizes print by what they are (``[batch, 16, 1, height, width]``), never as torch's symbols (``s77``;
only the JSON keeps those): `size_names` reads them off the graph's first input, whose dims the model table
names (`rewrite.supported.SupportedModel.latent_dims`). Graph sizes are counted in tensor ops
(`rewrite.reporting.op_count`), as `rewrite.report` counts them, so both say the same number for a graph.

Output: `format_summary` (the default text: a pattern family x graph table of matched and declined counts,
near misses grouped by kind), `format_text` (``--details``: every pattern, match and near miss), `to_json`
(everything), `write_dot_files` (the whole graph with one colour per pattern and a box per match, combined
matches around the matches they combine; one file per match) and `write_graphml`. Read-only towards the
library: the graphs given are rewritten in place, as `optimize` would rewrite them, and nothing else changes.
"""

from __future__ import annotations

import collections
import colorsys
import dataclasses
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import torch
import torch.fx as fx

from rewrite.capture.export import CapturedGraph
from rewrite.engine.export_graph import describe_value, graph_to_networkx, to_dot
from rewrite.engine.matcher import Match, MatchResult, NearMiss, describe_target, module_stack, module_type_names
from rewrite.engine.pattern import Pattern
from rewrite.levels import level_enables
from rewrite.passes.manager import PassContext
from rewrite.pipeline import pipeline_for
from rewrite.reporting import op_count

FUSE_PASS = "fuse_patterns"
#: near misses shown per pattern and graph in the text output (the JSON lists all)
NEAR_MISSES_SHOWN = 10
#: ops whose float32 dtype argument is an upcast (removed from float32 graphs by canonicalize)
CAST_OPS = ("aten::to", "aten::_to_copy")
#: the kinds of not-applicable reasons, by how a reason starts, as `format_hidden` counts them
KINDS = {"needs --level": "other level", "other model": "other model", "dtype": "dtype", "needs CUDA": "needs CUDA"}


# --------------------------------------------------------------------------------------------- records


@dataclasses.dataclass
class NodeRecord:
    """One matched graph node: its name, op, output shape and dtype, and the nodes it reads."""

    name: str
    op: str
    shape: str
    dtype: str
    inputs: list[str]


@dataclasses.dataclass
class SubgraphRecord:
    """One match, recorded before it was replaced."""

    pattern: str
    family: str
    graph: str
    number: int  # k of "pattern #k": the match's place among the pattern's matches in this graph
    module: str  # deepest module common to the matched nodes ("<root>" for the decoder itself)
    module_type: str
    cross_check: bool  # False when the pattern names module types and the match came from none of them
    anchor: str
    nodes: list[NodeRecord]
    inputs: dict[str, str]  # pattern parameter -> graph node
    scalars: dict[str, Any]  # literal parameter -> bound value (JSON-safe)
    combines: list[str] = dataclasses.field(default_factory=list)  # earlier matches whose ops this one matched
    combined_into: str | None = None  # the later match that matched this one's op

    @property
    def label(self) -> str:
        return f"{self.pattern} #{self.number}"


@dataclasses.dataclass
class GraphFindings:
    """What the passes found in one graph; ``snapshot`` is the graph as ``fuse_patterns`` saw it."""

    name: str
    nodes: int  # every node as captured (placeholders and shape arithmetic included)
    dtype: torch.dtype
    device: torch.device
    module_types: frozenset[str]  # classes the graph's nodes came from, qualified and short names
    sizes: dict[str, str] = dataclasses.field(default_factory=dict)  # symbol -> what it is ("s0" -> "height")
    input_shape: str = ""  # the first input's shape, sizes named
    nodes_after: int = 0  # after the passes
    ops: int = 0  # tensor ops as captured (`rewrite.reporting.op_count`, the count `report` prints)
    ops_after: int = 0  # tensor ops after the passes
    passes: list[str] = dataclasses.field(default_factory=list)
    matches: dict[str, int] = dataclasses.field(default_factory=dict)
    rejections: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # pattern -> reasons
    near_misses: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    #: pattern -> kind of near miss (`near_miss_kind`: what was expected, found, without node names) -> count
    near_miss_kinds: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    subgraphs: list[SubgraphRecord] = dataclasses.field(default_factory=list)
    snapshot: nx.DiGraph = dataclasses.field(default_factory=nx.DiGraph)
    provenance_known: bool = True  # False when it is unknown which match created which node

    @property
    def rewritten(self) -> bool:
        return bool(self.passes)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


# --------------------------------------------------------------------------------------------- sizes


SYMBOL = re.compile(r"\bs\d+\b")


def _first_input(graph: CapturedGraph) -> fx.Node | None:
    names = graph.user_input_names
    return next((n for n in graph.graph_module.graph.nodes if n.op == "placeholder" and n.name == names[0]), None) \
        if names else None


def size_names(graph: CapturedGraph, dims: Sequence[str]) -> dict[str, str]:
    """Symbol -> name for the symbolic dims of the graph's first input, named by ``dims`` in order
    (``{"s77": "batch", "s0": "height", "s92": "width"}`` for a Wan step graph)."""
    first = _first_input(graph)
    val = first.meta.get("val") if first is not None else None
    names: dict[str, str] = {}
    if isinstance(val, torch.Tensor):
        for name, size in zip(dims, val.shape):
            if SYMBOL.fullmatch(str(size)) and str(size) not in names:
                names[str(size)] = name
    return names


def name_sizes(text: str, names: Mapping[str, str]) -> str:
    """``text`` with every symbol of ``names`` replaced by its name (``[s77, 16]`` -> ``[batch, 16]``)."""
    return SYMBOL.sub(lambda m: names.get(m.group(0), m.group(0)), text) if names else text


def _graph_module_types(graph: fx.Graph) -> frozenset[str]:
    return frozenset(name for node in graph.nodes for _, qual in module_stack(node) for name in module_type_names(qual))


# --------------------------------------------------------------------------------------------- recording


NearMissWanted = Callable[[Pattern, int, "str | None"], bool]  # (pattern, matches, static reason) -> compute?


def record_match(graph_name: str, match: Match, number: int, sizes: Mapping[str, str]) -> SubgraphRecord:
    """A match's nodes in the pattern's op order, with what ``node.meta`` says about each."""
    ordered = [match.nodes[pn] for pn in match.pattern.search_graph.nodes if pn in match.nodes]
    nodes = []
    for node in ordered:
        shape, dtype = describe_value(node.meta.get("val"))
        nodes.append(NodeRecord(node.name, describe_target(node), name_sizes(shape, sizes), dtype,
                                [a.name for a in node.all_input_nodes]))
    return SubgraphRecord(
        pattern=match.pattern.name, family=match.pattern.family, graph=graph_name, number=number,
        module=match.module_path or "<root>", module_type=match.module_type, cross_check=match.cross_check(),
        anchor=match.anchor.name, nodes=nodes, inputs={k: n.name for k, n in match.inputs.items()},
        scalars={k: _jsonable(v) for k, v in match.scalars.items()})


class _Recorder:
    """The ``match_observer`` of one graph's run.

    Which match created which node: ``replace_matches`` replaces a pattern's matches in order, each by the
    call nodes of the pattern's replacement graph, before the next pattern is observed; the nodes created in
    between (seen by a create-node hook on the graph module) are split into one run per match.
    """

    def __init__(self, report: GraphFindings, wanted: Callable[[Pattern, int], bool]) -> None:
        self.report, self.wanted = report, wanted
        self.gm: fx.GraphModule | None = None
        self.numbers: collections.Counter[str] = collections.Counter()
        self.creator: dict[fx.Node, SubgraphRecord] = {}  # node made by a replacement -> its match
        self.pending: list[SubgraphRecord] = []  # the last pattern's matches, replaced after it was observed
        self.pending_calls = 0  # call nodes per replacement of that pattern
        self.created: list[fx.Node] = []
        self.hook: Callable[[fx.Node], None] | None = None

    def __call__(self, pattern: Pattern, result: MatchResult) -> None:
        if self.gm is None:
            self.start(result.gm)
        self.settle()
        for match in result.matches:
            self.numbers[pattern.name] += 1
            record = record_match(self.report.name, match, self.numbers[pattern.name], self.report.sizes)
            for node in match.graph_nodes:
                inner = self.creator.get(node)
                if inner is not None and inner.combined_into is None:
                    inner.combined_into = record.label
                    record.combines.append(inner.label)
            self.report.subgraphs.append(record)
        self.pending = self.report.subgraphs[len(self.report.subgraphs) - len(result.matches):]
        self.pending_calls = sum(n.op == "call_function" for n in pattern.replace_graph.nodes)
        if result.rejected:
            self.report.rejections[pattern.name] = [r.reason for r in result.rejected]
        if self.wanted(pattern, len(result.matches)):
            misses = result.near_misses()
            self.report.near_misses[pattern.name] = [miss.reason for miss in misses]
            names = {node.name for node in result.gm.graph.nodes}
            kinds = collections.Counter(near_miss_kind(miss, names) for miss in misses)
            self.report.near_miss_kinds[pattern.name] = dict(kinds.most_common())

    def start(self, gm: fx.GraphModule) -> None:
        """The graph as ``fuse_patterns`` received it; creation of nodes watched from now on."""
        self.gm = gm
        self.report.snapshot = _named_snapshot(gm.graph, self.report.sizes)
        register = getattr(gm, "_register_create_node_hook", None)  # torch.fx, since torch 2.3
        if register is None:
            self.report.provenance_known = False
        else:
            self.hook = self.created.append
            register(self.hook)

    def settle(self) -> None:
        """Attribute the nodes created since the last observation to the last pattern's matches."""
        calls, pending, created = self.pending_calls, self.pending, self.created
        if len(created) >= len(pending) * calls:
            for i, record in enumerate(pending):
                self.creator.update((node, record) for node in created[i * calls:(i + 1) * calls])
        elif pending:
            self.report.provenance_known = False
        self.pending = []
        created.clear()

    def close(self) -> None:
        if self.hook is not None:
            self.gm._unregister_create_node_hook(self.hook)
            self.hook = None


#: a token of a near miss's ``found`` text that may be a graph node's name (dotted op names are one token)
TOKEN = re.compile(r"[A-Za-z_][\w.]*")


def near_miss_kind(miss: NearMiss, node_names: Collection[str]) -> str:
    """What a near miss has in common with others of its kind: the rejection reason of a complete candidate,
    the pattern ops never reached, or ``expected X but found Y`` with the graph's node names left out of Y
    (``expected aten.expand.default but found placeholder``)."""
    if miss.expected == "a usable match":
        return miss.found
    if miss.found == "no path to them":
        return f"pattern ops {miss.expected} never reached"
    found = TOKEN.sub(lambda m: "" if m.group(0) in node_names else m.group(0), miss.found)
    found = re.sub(r"\(\s*\)", "", re.sub(r"\(\s+", "(", re.sub(r"\s+", " ", found))).strip()
    return f"expected {miss.expected} but found {found or 'another node'}"


def _named_snapshot(graph: fx.Graph, sizes: Mapping[str, str]) -> nx.DiGraph:
    snapshot = graph_to_networkx(graph)
    for _, attributes in snapshot.nodes(data=True):
        attributes["shape"] = name_sizes(attributes.get("shape", ""), sizes)
    return snapshot


def explain_graph(graph: CapturedGraph, level: str, near_miss_wanted: NearMissWanted,
                  latent_dims: Sequence[str] = ()) -> GraphFindings:
    """Run the level's pipeline on ``graph`` (in place), recording what ``fuse_patterns`` matches.

    ``near_miss_wanted(pattern, matches, reason)`` decides whose near misses are computed (``reason``: why
    the pattern does not apply to this graph, from `static_reason`, or None). At level ``off`` nothing runs.
    """
    sizes = size_names(graph, latent_dims)
    first = _first_input(graph)
    report = GraphFindings(graph.name, nodes=graph.node_count, dtype=graph.dtype, device=graph.device,
                         module_types=_graph_module_types(graph.graph_module.graph), sizes=sizes,
                         input_shape=name_sizes(describe_value(first.meta.get("val"))[0], sizes) if first else "",
                         ops=op_count(graph.graph_module.graph))
    if level == "off":
        report.snapshot = _named_snapshot(graph.graph_module.graph, sizes)
        report.nodes_after, report.ops_after = graph.node_count, report.ops
        return report

    recorder = _Recorder(report, lambda p, count: near_miss_wanted(p, count, static_reason(p, level, report)))
    ctx = PassContext(level=level, dtype=graph.dtype, device=graph.device, match_observer=recorder)
    try:
        results = pipeline_for(level).run(graph.graph_module, ctx)
    finally:
        recorder.close()
    report.passes = [name for name, _ in results]
    report.matches = dict(ctx.report.get(FUSE_PASS, {}).get("matches", {}))
    if recorder.gm is None:  # no pattern ran: the graph is as fuse_patterns saw it
        report.snapshot = _named_snapshot(graph.graph_module.graph, sizes)
    final = results[-1][1].gm.graph if results else graph.graph_module.graph
    report.nodes_after, report.ops_after = len(final.nodes), op_count(final)
    return report


# --------------------------------------------------------------------------------------------- applicability


def _literals(value: Any) -> Iterable[Any]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _literals(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _literals(item)
    else:
        yield value


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_reason(pattern: Pattern, dtype: torch.dtype) -> str | None:
    """Why ``pattern`` cannot match a graph of ``dtype``, from the dtypes its search names, or None."""
    named: set[torch.dtype] = set()
    upcasts = False
    for node in pattern.search_graph.nodes:
        if node.op != "call_function":
            continue
        dtypes = {v for v in _literals((node.args, node.kwargs)) if isinstance(v, torch.dtype)}
        named |= dtypes
        schema = getattr(node.target, "_schema", None)
        upcasts |= schema is not None and schema.name in CAST_OPS and torch.float32 in dtypes
    other = sorted(_dtype_name(d) for d in named - {dtype, torch.float32})
    if other:
        return f"dtype: matches {' and '.join(other)} graphs (this one is {_dtype_name(dtype)})"
    if upcasts and dtype == torch.float32:
        return "dtype: matches an upcast to float32, which a float32 graph does not have"
    return None


def static_reason(pattern: Pattern, level: str, report: GraphFindings) -> str | None:
    """Why ``pattern`` does not apply to the graph of ``report`` at ``level``, known before matching: its
    level, the module classes it names, the dtypes it names. None when it may apply."""
    if not level_enables(level, pattern.level):
        return f"needs --level {pattern.level}"
    missing = [t for t in pattern.module_types if t not in report.module_types]
    if missing:
        return f"other model: matches {' and '.join(missing)} modules, which this model does not have"
    return dtype_reason(pattern, report.dtype)


def _device_words(device: torch.device) -> re.Pattern:
    return re.compile(rf"\bon {re.escape(device.type)}\b")


def device_reasons(patterns: Sequence[Pattern], reports: Sequence[GraphFindings]) -> dict[str, str]:
    """Pattern -> ``needs CUDA: ...`` for every variant of a family that matched nowhere and whose guard
    rejected a candidate because of the graphs' device (its reason names it: "runs on cpu")."""
    families: dict[str, list[Pattern]] = {}
    for pattern in patterns:
        families.setdefault(pattern.family, []).append(pattern)
    reasons: dict[str, str] = {}
    for members in families.values():
        if any(report.matches.get(p.name) for p in members for report in reports):
            continue
        cited = next((reason.removeprefix("guard failed: ") for report in reports for p in members
                      for reason in report.rejections.get(p.name, ()) if _device_words(report.device).search(reason)),
                     None)
        if cited is not None:
            device = reports[0].device.type
            need = "needs CUDA" if device != "cuda" else "needs another device"
            reasons.update((p.name, f"{need}: its guard rejects {device} graphs ({cited})") for p in members)
    return reasons


def not_applicable(patterns: Sequence[Pattern], reports: Sequence[GraphFindings], level: str) -> dict[str, str]:
    """Pattern -> why it cannot match any of these graphs (see the module docstring); the patterns that
    may match are absent."""
    reasons: dict[str, str] = {}
    for pattern in patterns:
        found = [static_reason(pattern, level, report) for report in reports]
        if found and all(found):
            reasons[pattern.name] = found[0]
    device = device_reasons([p for p in patterns if p.name not in reasons], reports)
    return {p.name: reasons.get(p.name) or device[p.name] for p in patterns if p.name in reasons or p.name in device}


def reason_kind(reason: str) -> str:
    """``other level``, ``other model``, ``dtype`` or ``needs CUDA``: what kind of reason ``reason`` is."""
    return next((kind for start, kind in KINDS.items() if reason.startswith(start)), reason.split(":", 1)[0])


# --------------------------------------------------------------------------------------------- selection


def enabled_patterns(level: str) -> list[Pattern]:
    """The registry's patterns that ``level`` enables, in registry (= matching) order."""
    from rewrite import patterns as pattern_registry

    return [p for p in pattern_registry.registry() if level_enables(level, p.level)]


def select_patterns(names: Sequence[str] | None, level: str, every_level: bool = False) -> tuple[list[Pattern], str | None]:
    """The patterns named (exact name or family) in ``names`` (all when None) that ``level`` enables (any
    level with ``every_level``), or an error."""
    from rewrite import patterns as pattern_registry

    every = list(pattern_registry.registry())
    candidates = every if every_level else enabled_patterns(level)
    if not names:
        return candidates, None
    if not every:
        return [], "no patterns are registered (rewrite.patterns.registry() is empty)"
    usable_names = {p.name for p in candidates}
    selected: set[str] = set()
    for name in names:
        named = [p for p in every if name in (p.name, p.family)]
        if not named:
            known = sorted({p.family for p in every} | {p.name for p in every})
            return [], f"unknown pattern {name!r}; known patterns and families: {', '.join(known)}"
        usable = {p.name for p in named} & usable_names
        if not usable:
            needed = sorted({p.level for p in named})
            return [], f"pattern {name!r} is not enabled at level {level!r} (it needs --level {' or '.join(needed)})"
        selected |= usable
    return [p for p in candidates if p.name in selected], None


def graph_name_error(names: Sequence[str] | None, known: Sequence[str]) -> str | None:
    """An error naming the graphs when ``names`` holds one the model does not have, else None."""
    unknown = [n for n in names or () if n not in known]
    if unknown:
        return f"unknown graph {', '.join(map(repr, unknown))}; this model's graphs: {', '.join(known)}"
    return None


def near_miss_policy(enabled: bool, selected: Sequence[Pattern], patterns_named: bool) -> NearMissWanted:
    """Near misses of selected patterns: every one when patterns were named, else those that may apply to
    the graph and did not match there."""
    chosen = {p.name for p in selected}

    def wanted(pattern: Pattern, count: int, reason: str | None) -> bool:
        return enabled and pattern.name in chosen and (patterns_named or (count == 0 and reason is None))

    return wanted


def without_graph_specific_near_misses(reports: Sequence[GraphFindings]) -> list[GraphFindings]:
    """``reports`` without the near misses of patterns that matched in another of the graphs: a variant for
    another graph (chunk 0's causal conv input in the steady graph) explains nothing there."""
    matched = {name for report in reports for name, count in report.matches.items() if count}
    return [dataclasses.replace(report, near_misses={n: r for n, r in report.near_misses.items() if n not in matched},
                                near_miss_kinds={n: k for n, k in report.near_miss_kinds.items() if n not in matched})
            for report in reports]


def shown(report: GraphFindings, patterns: Sequence[Pattern]) -> GraphFindings:
    """``report`` restricted to ``patterns``: their counts (zeros included; only those that ran), near misses
    and matches."""
    names = [p.name for p in patterns if not report.passes or p.name in report.matches]
    return dataclasses.replace(
        report,
        matches={n: report.matches.get(n, 0) for n in names},
        rejections={n: report.rejections[n] for n in names if n in report.rejections},
        near_misses={n: report.near_misses[n] for n in names if n in report.near_misses},
        near_miss_kinds={n: report.near_miss_kinds[n] for n in names if n in report.near_miss_kinds},
        subgraphs=[s for s in report.subgraphs if s.pattern in names])


# --------------------------------------------------------------------------------------------- text


@dataclasses.dataclass
class Heading:
    """What was captured: the first line of the text report and the JSON's head."""

    model: str
    config: str
    dtype: str
    level: str


def _columns(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """Rows as aligned columns, left-aligned but for the column indices in ``right``."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def format_table(reports: Sequence[GraphFindings], patterns: Sequence[Pattern], level: str,
                 reasons: Mapping[str, str] | None = None) -> str:
    """Rows: the patterns shown (zero counts included, ``-`` where a pattern did not run); columns: the
    graphs, and with ``reasons`` why each pattern that cannot match does not apply."""
    header = ["pattern", *(r.name for r in reports)]
    rows = [[p.name, *(str(r.matches[p.name]) if p.name in r.matches else "-" for r in reports)] for p in patterns]
    if reasons is not None:
        header.append("does not apply")
        for row, pattern in zip(rows, patterns):
            row.append(reasons.get(pattern.name, ""))
    return _table(header, rows, len(reports), patterns, level)


def _table(header: list[str], rows: list[list[str]], numeric: int, patterns: Sequence[Pattern], level: str,
           subheader: list[str] | None = None) -> str:
    """Header (and subheader), a rule, the rows; columns 1..``numeric`` right-aligned."""
    heads = [header] + ([subheader] if subheader else [])
    widths = [max(len(row[i]) for row in [*heads, *rows]) for i in range(len(header))]
    lines = _columns([*heads, ["-" * w for w in widths], *rows], right=range(1, numeric + 1))
    if not patterns:
        lines.insert(len(heads) + 1, f"(no patterns enabled at level {level!r})")
    return "\n".join(lines)


def families(patterns: Sequence[Pattern]) -> dict[str, list[Pattern]]:
    """Family -> its patterns among ``patterns``, families in the order of their first pattern."""
    grouped: dict[str, list[Pattern]] = {}
    for pattern in patterns:
        grouped.setdefault(pattern.family, []).append(pattern)
    return grouped


def family_counts(report: GraphFindings, members: Sequence[Pattern]) -> tuple[str, str]:
    """(matched, declined) of a family in one graph: its patterns' matches, and the candidates that matched
    its structure but that its guards (or an overlap, or containment) rejected; ``-`` for both where none of
    its patterns ran."""
    ran = [p.name for p in members if p.name in report.matches]
    if not ran:
        return "-", "-"
    return (str(sum(report.matches[name] for name in ran)),
            str(sum(len(report.rejections.get(name, ())) for name in ran)))


def family_reason(members: Sequence[Pattern], reasons: Mapping[str, str]) -> str:
    """Why a family does not apply: its patterns' reasons (one when they share it), or "" when one may apply."""
    found = [reasons.get(p.name) for p in members]
    return "; ".join(dict.fromkeys(found)) if all(found) else ""


def format_family_table(reports: Sequence[GraphFindings], patterns: Sequence[Pattern], level: str,
                        reasons: Mapping[str, str] | None = None) -> str:
    """The summary table: a row per pattern family of ``patterns``, per graph two columns: how many times the
    family matched and how many candidates it declined; with ``reasons`` a column of why a family does not
    apply."""
    header, subheader = ["pattern family"], [""]
    for report in reports:
        header += [report.name, ""]
        subheader += ["matched", "declined"]
    rows = [[family, *(cell for report in reports for cell in family_counts(report, members))]
            for family, members in families(patterns).items()]
    if reasons is not None:
        header.append("does not apply")
        subheader.append("")
        for row, members in zip(rows, families(patterns).values()):
            row.append(family_reason(members, reasons))
    return _table(header, rows, 2 * len(reports), patterns, level, subheader)


def format_ops(reports: Sequence[GraphFindings]) -> str:
    """One line of each graph's tensor ops, captured and rewritten, counted as `report` counts them."""
    if any(r.rewritten for r in reports):
        counts = ", ".join(f"{r.name} {r.ops} -> {r.ops_after}" for r in reports)
        what = "captured -> rewritten"
    else:
        counts, what = ", ".join(f"{r.name} {r.ops}" for r in reports), "captured, not rewritten"
    return f"tensor ops, {what}: {counts} (as report() counts: no weights, inputs or shape arithmetic)"


def format_sizes(reports: Sequence[GraphFindings]) -> str | None:
    """What the graphs' symbolic sizes are, by name only: ``sizes: batch, height, width are symbolic (any
    value); chunk0 and steady take their input [batch, 4, 1, height, width]``. None when no size is symbolic."""
    named = list(dict.fromkeys(name for report in reports for name in report.sizes.values()))
    if not named:
        return None
    by_shape: dict[str, list[str]] = {}
    for report in reports:
        by_shape.setdefault(report.input_shape, []).append(report.name)
    inputs = "; ".join(f"{' and '.join(names)} take{'s its' if len(names) == 1 else ' their'} input {shape}"
                       for shape, names in by_shape.items())
    return f"sizes: {', '.join(named)} {'is' if len(named) == 1 else 'are'} symbolic (any value); {inputs}"


def format_subgraph(record: SubgraphRecord) -> str:
    """Pattern, graph, source module and class, what it combines, its inputs, then one line per node:
    name, op, shape, dtype and the nodes it reads."""
    note = "" if record.cross_check else "  [outside the pattern's module types]"
    lines = [f"{record.label} in {record.graph}: {record.module} ({record.module_type}){note}"]
    if record.combines:
        lines.append("    combines: " + ", ".join(record.combines))
    if record.inputs:
        lines.append("    inputs: " + ", ".join(f"{k} = {v}" for k, v in record.inputs.items()))
    rows = [[f"    {n.name}", n.op, n.shape, n.dtype, "<- " + (", ".join(n.inputs) or "(no node)")] for n in record.nodes]
    lines += _columns(rows) if rows else []
    if record.scalars:
        lines.append("    scalars: " + ", ".join(f"{k}={v!r}" for k, v in record.scalars.items()))
    return "\n".join(lines)


def format_near_misses(report: GraphFindings) -> list[str]:
    lines = []
    for pattern, reasons in report.near_misses.items():
        lines.append(f"near misses of {pattern} in {report.name}:")
        if not reasons:
            lines.append("    (none: no candidate left; the graph lacks the pattern's ops or every candidate matched)")
        lines += [f"    - {reason}" for reason in reasons[:NEAR_MISSES_SHOWN]]
        if len(reasons) > NEAR_MISSES_SHOWN:
            lines.append(f"    ({len(reasons) - NEAR_MISSES_SHOWN} more; --json lists all)")
    return lines


#: near-miss kinds listed per pattern and graph in the summary (`format_near_miss_summary`)
NEAR_MISS_KINDS_SHOWN = 3


def format_near_miss_summary(report: GraphFindings) -> list[str]:
    """Per pattern of ``report`` with near misses: how many, and the most common kinds with their counts."""
    lines = []
    for pattern, kinds in report.near_miss_kinds.items():
        total = sum(kinds.values())
        lines.append(f"near misses of {pattern} in {report.name}: {total}" + ("" if total else
                     " (no candidate left: the graph lacks the pattern's ops or every candidate matched)"))
        shown_kinds = list(kinds.items())[:NEAR_MISS_KINDS_SHOWN]
        width = max((len(str(count)) for _, count in shown_kinds), default=0)
        lines += [f"    {count:>{width}} x {kind}" for kind, count in shown_kinds]
        if len(kinds) > NEAR_MISS_KINDS_SHOWN:
            rest = sum(count for _, count in list(kinds.items())[NEAR_MISS_KINDS_SHOWN:])
            lines.append(f"    ({rest} more, of {len(kinds) - NEAR_MISS_KINDS_SHOWN} other kinds)")
    return lines


def format_hidden(reasons: Mapping[str, str]) -> str | None:
    """One line counting the patterns left out of the table, by kind of reason."""
    if not reasons:
        return None
    kinds = collections.Counter(reason_kind(r) for r in reasons.values())
    counted = ", ".join(f"{kind}: {count}" for kind, count in kinds.items())
    return f"{len(reasons)} patterns do not apply here and are not shown ({counted}); --all-patterns lists them"


def _head(heading: Heading, reports: Sequence[GraphFindings]) -> list[str]:
    """The heading line, the level-off note and the sizes line."""
    lines = [f"{heading.model} ({heading.config}, {heading.dtype}) at level {heading.level}"]
    if heading.level == "off":
        lines.append("level off rewrites nothing: optimize installs nothing there and no pass runs")
    legend = format_sizes(reports)
    return lines + ([legend] if legend else [])


def _tail(heading: Heading, reports: Sequence[GraphFindings], hidden: Mapping[str, str]) -> list[str]:
    """The lines under a table: the tensor ops, and how many patterns were left out."""
    note = format_hidden(hidden) if heading.level != "off" else None
    return [format_ops(reports)] + ([note] if note else [])


#: under the summary's table when a family declined a candidate
DECLINED_NOTE = ("declined: candidates with the family's ops that its guard (or an overlap with another match) "
                 "turned down; --json says why")
#: the last line of the summary (`format_summary`)
DETAILS_HINT = ("--details lists each pattern's count, every match and (with --near-misses) each near miss; "
                "--json all of it")


def format_summary(heading: Heading, reports: Sequence[GraphFindings], patterns: Sequence[Pattern],
                   hidden: Mapping[str, str], reasons: Mapping[str, str] | None = None) -> str:
    """The default `rewrite-debug` text: heading, sizes, a family x graph table of matched and declined
    counts, tensor ops, near misses by kind (where computed), and how to see more.

    ``hidden``: the patterns left out, with why; ``reasons``: why each shown pattern does not apply (given
    when the table shows those too)."""
    lines = _head(heading, reports) + ["", format_family_table(reports, patterns, heading.level, reasons)]
    lines += _tail(heading, reports, hidden)
    if any(report.rejections.get(p.name) for report in reports for p in patterns):
        lines.append(DECLINED_NOTE)
    near = [line for report in reports for line in format_near_miss_summary(report)]
    if near:
        lines += ["", *near]
    return "\n".join(lines + (["", DETAILS_HINT] if heading.level != "off" else []))


def format_text(heading: Heading, reports: Sequence[GraphFindings], patterns: Sequence[Pattern],
                hidden: Mapping[str, str], reasons: Mapping[str, str] | None = None) -> str:
    """The `rewrite-debug --details` text: heading, sizes, pattern x graph match table, every match, near
    misses (`NEAR_MISSES_SHOWN` per pattern and graph).

    ``hidden`` and ``reasons`` as for `format_summary`."""
    lines = _head(heading, reports) + ["", format_table(reports, patterns, heading.level, reasons)]
    lines += _tail(heading, reports, hidden)
    for report in reports:
        for record in report.subgraphs:
            lines += ["", format_subgraph(record)]
        if not report.provenance_known:
            lines += ["", f"(which match created which node of {report.name} is unknown: combined matches are "
                          "listed without what they combine)"]
    near = [line for report in reports for line in format_near_misses(report)]
    if near:
        lines += ["", *near]
    return "\n".join(lines)


def to_json(heading: Heading, reports: Sequence[GraphFindings], not_applicable: Mapping[str, str]) -> str:
    graphs = [{"name": r.name, "nodes": r.nodes, "nodes_after": r.nodes_after, "ops": r.ops, "ops_after": r.ops_after,
               "passes": r.passes, "sizes": {name: symbol for symbol, name in r.sizes.items()}, "input": r.input_shape,
               "matches": r.matches, "declined": r.rejections, "near_misses": r.near_misses,
               "near_miss_kinds": r.near_miss_kinds,
               "subgraphs": [dataclasses.asdict(s) for s in r.subgraphs]} for r in reports]
    return json.dumps({**dataclasses.asdict(heading), "graphs": graphs, "not_applicable": dict(not_applicable)},
                      indent=2)


# --------------------------------------------------------------------------------------------- colours


def distinct_colors(count: int) -> list[str]:
    """``count`` different light fill colours (``#rrggbb``): hues a golden angle apart, in three
    saturations and two brightnesses, so neighbours in the list differ the most."""
    colors: list[str] = []
    for i in range(count):
        hue = (i * 0.618033988749895) % 1.0
        while True:
            rgb = colorsys.hsv_to_rgb(hue, (0.25, 0.40, 0.55)[i % 3], (1.0, 0.9)[(i // 3) % 2])
            color = "#" + "".join(f"{round(255 * c):02x}" for c in rgb)
            if color not in colors:
                break
            hue = (hue + 0.003) % 1.0
        colors.append(color)
    return colors


def pattern_colors(reports: Sequence[GraphFindings]) -> dict[str, str]:
    """One colour per pattern that matched in any of ``reports``, none shared (in matching order)."""
    names = list(dict.fromkeys(s.pattern for r in reports for s in r.subgraphs))
    return dict(zip(names, distinct_colors(len(names))))


# --------------------------------------------------------------------------------------------- files


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def _dot_text(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _node_text(name: str, attributes: Mapping[str, str], match: str | None) -> str:
    """A node's DOT label: name, op, shape and dtype, and the match it belongs to."""
    shape_dtype = f"{attributes.get('shape', '')} {attributes.get('dtype', '')}".strip()
    op = attributes.get("target", "") if attributes.get("op") == "call_function" else ""
    return "\n".join(part for part in (name, op, shape_dtype, match) if part)


def match_labels(report: GraphFindings) -> dict[str, list[str]]:
    """Node of the graph ``fuse_patterns`` received -> the labels (``pattern #k``) of the matches that
    replaced it, innermost first: the match that matched it, then the matches that combined that one."""
    by_label = {s.label: s for s in report.subgraphs}
    labels: dict[str, list[str]] = {}
    for record in report.subgraphs:
        chain, outer = [record.label], record.combined_into
        while outer is not None:
            chain.append(outer)
            outer = by_label[outer].combined_into if outer in by_label else None
        for node in record.nodes:
            if node.name in report.snapshot:
                labels[node.name] = chain
    return labels


def graph_dot(report: GraphFindings, colors: Mapping[str, str]) -> str:
    """DOT text of the graph ``fuse_patterns`` received: every matched node filled in its pattern's colour
    and labelled with its match, each match a box around its nodes (a combined match's box around the boxes
    of the matches it combines), and a legend of the patterns."""
    labels = match_labels(report)
    by_label = {s.label: s for s in report.subgraphs}
    members: dict[str, list[str]] = collections.defaultdict(list)  # match -> its own nodes in the graph
    for node, chain in labels.items():
        members[chain[0]].append(node)
    inner: dict[str, list[str]] = collections.defaultdict(list)  # match -> the matches it combines
    for record in report.subgraphs:
        if record.combined_into is not None:
            inner[record.combined_into].append(record.label)
    drawn = {label for chain in labels.values() for label in chain}

    lines = [f"digraph {_dot_text(report.name)} {{", "  rankdir=TB;",
             '  node [shape=box, fontname="monospace", fontsize=10];']
    for node, attributes in report.snapshot.nodes(data=True):
        options = [f"label={_dot_text(_node_text(node, attributes, labels.get(node, [None])[0]))}"]
        if node in labels:
            color = colors[by_label[labels[node][0]].pattern]
            options += ['style="filled"', f"fillcolor={_dot_text(color)}"]
        lines.append(f"  {_dot_text(node)} [{', '.join(options)}];")

    def cluster(label: str, depth: int) -> None:
        pad = "  " * depth
        lines.append(f"{pad}subgraph {_dot_text('cluster_' + label)} {{")
        lines.append(f"{pad}  label={_dot_text(label)}; fontname=\"monospace\"; penwidth=2; "
                     f"color={_dot_text(colors[by_label[label].pattern])};")
        lines.extend(f"{pad}  {_dot_text(node)};" for node in members.get(label, ()))
        for child in inner.get(label, ()):
            if child in drawn:
                cluster(child, depth + 1)
        lines.append(f"{pad}}}")

    for record in report.subgraphs:
        if record.combined_into is None and record.label in drawn:
            cluster(record.label, 1)
    lines.extend(f"  {_dot_text(a)} -> {_dot_text(b)};" for a, b in report.snapshot.edges())
    legend = [name for name in colors if report.matches.get(name)]
    if legend:
        lines += ['  subgraph "cluster_legend" {', '    label="legend"; fontname="monospace";']
        lines += [f'    "legend_{i}" [label={_dot_text(name)}, style="filled", fillcolor={_dot_text(colors[name])}];'
                  for i, name in enumerate(legend)]
        lines.append("  }")
    return "\n".join(lines + ["}"]) + "\n"


def subgraph_digraph(record: SubgraphRecord, snapshot: nx.DiGraph) -> tuple[nx.DiGraph, list[str]]:
    """The matched nodes, the outside nodes they read (returned second), and the edges between them."""
    digraph = nx.DiGraph()
    matched = {n.name for n in record.nodes}
    outside = []
    for node in record.nodes:
        digraph.add_node(node.name, op="call_function", target=node.op, shape=node.shape, dtype=node.dtype)
        for producer in node.inputs:
            if producer not in matched and producer not in digraph:
                digraph.add_node(producer, **snapshot.nodes.get(producer, {}))
                outside.append(producer)
            digraph.add_edge(producer, node.name)
    return digraph, outside


def write_dot_files(directory: Path, reports: Sequence[GraphFindings], colors: Mapping[str, str]) -> list[Path]:
    """Per graph ``GRAPH.dot`` (`graph_dot`) and ``GRAPH.PATTERN.K.dot`` per match (its nodes, and the nodes
    it reads dashed)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for report in reports:
        path = directory / f"{_slug(report.name)}.dot"
        path.write_text(graph_dot(report, colors))
        written.append(path)
        for record in report.subgraphs:
            digraph, outside = subgraph_digraph(record, report.snapshot)
            title = f"{record.label} in {report.name}: {record.module}"
            fill = {n.name: colors[record.pattern] for n in record.nodes}
            path = directory / f"{_slug(report.name)}.{_slug(record.pattern)}.{record.number}.dot"
            path.write_text(to_dot(digraph, title, fill, dashed=outside))
            written.append(path)
    return written


def write_graphml(path: Path, reports: Sequence[GraphFindings]) -> None:
    """Every graph in one GraphML file: nodes ``GRAPH/NODE`` with a ``graph`` attribute, matched ones
    with ``pattern``, ``match`` (``pattern #k``, as in the text report and the DOT file names) and
    ``matches`` (that match and the matches combining it, innermost first)."""
    combined = nx.DiGraph()
    by_label = {(r.name, s.label): s for r in reports for s in r.subgraphs}
    for report in reports:
        labels = match_labels(report)
        prefixed = nx.relabel_nodes(report.snapshot, {n: f"{report.name}/{n}" for n in report.snapshot})
        for node in report.snapshot:
            attributes = prefixed.nodes[f"{report.name}/{node}"]
            attributes.update(graph=report.name, name=node)
            if node in labels:
                chain = labels[node]
                attributes.update(pattern=by_label[(report.name, chain[0])].pattern, match=chain[0],
                                  matches=", ".join(chain))
        combined = nx.compose(combined, prefixed)
    path.parent.mkdir(parents=True, exist_ok=True)
    nx.write_graphml(combined, path)
