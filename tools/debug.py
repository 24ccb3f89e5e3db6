"""`rewrite-debug`: which patterns match where in a decoder's captured graphs, and why the others do not.

Builds the model with random weights (nothing is downloaded), captures its step graphs on the CPU (export
runs on fake tensors, so the full-size configs take seconds too) and runs the level's own pipeline on each
graph, observing ``fuse_patterns`` (``PassContext.match_observer``): each match is recorded before it is
replaced (nodes, ops, shapes, dtypes, source module) and, when asked, the near misses. Every pattern runs,
whatever ``--pattern`` selects, so the counts are the pipeline's; the filters only choose what is shown.

Output: a pattern x graph table of match counts (rows: the patterns the level enables, zeros included;
columns: the graphs), then every matched subgraph; ``--near-misses`` adds why patterns did not match;
``--json`` prints one JSON object instead (progress and notes go to stderr). ``--dot DIR`` writes
``GRAPH.dot`` (the graph as ``fuse_patterns`` received it, matched nodes filled in one color per pattern) and
``GRAPH.PATTERN.K.dot`` per match (its nodes, and the nodes it reads dashed); ``--graphml FILE`` writes the
same whole graphs with ``pattern`` and ``match`` attributes on matched nodes.

Usage: ``rewrite-debug wan2.1 [--config full] [--pattern rms_norm --near-misses] [--json]``,
``rewrite-debug auk [--config full] [--level channels_last]`` (one graph, ``decode``).

``--aten-activations`` (AuK) captures each alias-free activation as its 15 ATen ops, the
``alias_free_activation[..., aten]`` patterns' form, instead of the one op node `optimize` captures.

Models are adapters in ``MODELS``: name -> ``(config, dtype, aten_activations) -> list[CapturedGraph]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import torch

from rewrite.capture.export import CapturedGraph
from rewrite.engine.export_graph import describe_value, graph_to_networkx, to_dot
from rewrite.engine.matcher import Match, describe_target
from rewrite.engine.pattern import Pattern
from rewrite.levels import LEVELS, level_enables
from rewrite.passes.manager import PassContext, PassError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CONFIGS = ("full", "tiny")
FUSE_PASS = "fuse_patterns"
#: fill colors of matched nodes in DOT output, one per pattern (cycled)
PALETTE = ("lightblue", "palegreen", "lightsalmon", "plum", "khaki", "lightpink", "aquamarine", "wheat",
           "lightskyblue", "thistle", "darkseagreen", "peachpuff")
#: near misses shown per pattern and graph in the text output (--json lists all)
NEAR_MISSES_SHOWN = 10

ModelAdapter = Callable[..., list[CapturedGraph]]  # (config, dtype, aten_activations=False)


# --------------------------------------------------------------------------------------------- models


def wan_adapter(version: str) -> ModelAdapter:
    """Capture a random-init Wan decoder (``build_wan(version, config)``) on the CPU: chunk0 and steady."""

    def capture(config: str, dtype: torch.dtype, aten_activations: bool = False) -> list[CapturedGraph]:
        from rewrite.capture.wan import capture_wan_decoder
        from rewrite.models.wan import build_wan

        vae = build_wan(version, config)
        if dtype != torch.float32:  # build_wan makes float32 weights
            vae = vae.to(dtype)
        return list(capture_wan_decoder(vae.decoder, dtype, torch.device("cpu")))

    return capture


def auk_adapter(config: str, dtype: torch.dtype, aten_activations: bool = False) -> list[CapturedGraph]:
    """Capture the AuK decode graph: tiny on the CPU (random init), full on the meta device (no weights:
    export runs on fake tensors, so the 114.5 M-parameter decoder is never allocated). Each alias-free
    activation is one ``alias_free_snake_module`` node, as `optimize` captures it, or with
    ``aten_activations`` its ATen ops."""
    from rewrite.capture.auk import capture_auk_decode
    from rewrite.models.auk import AuKConfig, AuKVAE

    device = torch.device("meta" if config == "full" else "cpu")
    with device:
        vae = AuKVAE(AuKConfig() if config == "full" else AuKConfig.tiny())
    return [capture_auk_decode(vae.to(dtype), dtype, device, activations_as_ops=not aten_activations)]


MODELS: dict[str, ModelAdapter] = {
    "wan2.1": wan_adapter("wan2.1"), "wan2.2": wan_adapter("wan2.2"), "auk": auk_adapter,
}


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
    module: str  # deepest module common to the matched nodes ("<root>" for the decoder itself)
    module_type: str
    cross_check: bool  # False when the pattern names module types and the match came from none of them
    anchor: str
    nodes: list[NodeRecord]
    inputs: dict[str, str]  # pattern parameter -> graph node
    scalars: dict[str, Any]  # literal parameter -> bound value (JSON-safe)


@dataclasses.dataclass
class GraphReport:
    """What the passes found in one graph; ``snapshot`` is the graph as ``fuse_patterns`` saw it."""

    name: str
    nodes: int  # as captured
    nodes_after: int = 0  # after the passes
    matches: dict[str, int] = dataclasses.field(default_factory=dict)
    near_misses: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    subgraphs: list[SubgraphRecord] = dataclasses.field(default_factory=list)
    snapshot: nx.DiGraph = dataclasses.field(default_factory=nx.DiGraph)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def record_match(graph_name: str, match: Match) -> SubgraphRecord:
    """A match's nodes in the pattern's op order, with what ``node.meta`` says about each."""
    ordered = [match.nodes[pn] for pn in match.pattern.search_graph.nodes if pn in match.nodes]
    nodes = [NodeRecord(n.name, describe_target(n), *describe_value(n.meta.get("val")),
                        inputs=[a.name for a in n.all_input_nodes]) for n in ordered]
    return SubgraphRecord(
        pattern=match.pattern.name, family=match.pattern.family, graph=graph_name,
        module=match.module_path or "<root>", module_type=match.module_type, cross_check=match.cross_check(),
        anchor=match.anchor.name, nodes=nodes, inputs={k: n.name for k, n in match.inputs.items()},
        scalars={k: _jsonable(v) for k, v in match.scalars.items()})


# --------------------------------------------------------------------------------------------- passes


NearMissWanted = Callable[[Pattern, int], bool]  # (pattern, match count) -> compute its near misses?


def debug_graph(graph: CapturedGraph, level: str, near_miss_wanted: NearMissWanted) -> GraphReport:
    """Run the level's pipeline on ``graph`` (in place), recording what ``fuse_patterns`` matches."""
    from rewrite.pipeline import pipeline_for

    report = GraphReport(graph.name, nodes=graph.node_count)
    snapshot_taken = False

    def observe(pattern: Pattern, result) -> None:
        nonlocal snapshot_taken
        if not snapshot_taken:  # the graph as fuse_patterns received it
            report.snapshot, snapshot_taken = graph_to_networkx(result.gm.graph), True
        report.subgraphs.extend(record_match(report.name, m) for m in result.matches)
        if near_miss_wanted(pattern, len(result.matches)):
            report.near_misses[pattern.name] = [miss.reason for miss in result.near_misses()]

    ctx = PassContext(level=level, dtype=graph.dtype, device=graph.device, match_observer=observe)
    results = pipeline_for(level).run(graph.graph_module, ctx)
    report.matches = dict(ctx.report.get(FUSE_PASS, {}).get("matches", {}))
    if not snapshot_taken:  # no pattern ran: the graph is as fuse_patterns saw it
        report.snapshot = graph_to_networkx(graph.graph_module.graph)
    report.nodes_after = len(results[-1][1].gm.graph.nodes) if results else graph.node_count
    return report


# --------------------------------------------------------------------------------------------- selection


def enabled_patterns(level: str) -> list[Pattern]:
    """The registry's patterns that ``level`` enables, in registry (= matching) order."""
    from rewrite import patterns as pattern_registry

    return [p for p in pattern_registry.registry() if level_enables(level, p.level)]


def select_patterns(names: Sequence[str] | None, level: str) -> tuple[list[Pattern], str | None]:
    """The enabled patterns named (exact name or family) in ``names`` (all when None), or an error."""
    from rewrite import patterns as pattern_registry

    enabled = enabled_patterns(level)
    if not names:
        return enabled, None
    every = pattern_registry.registry()
    if not every:
        return [], "no patterns are registered (rewrite.patterns.registry() is empty)"
    enabled_names = {p.name for p in enabled}
    selected: set[str] = set()
    for name in names:
        named = [p for p in every if name in (p.name, p.family)]
        if not named:
            known = sorted({p.family for p in every} | {p.name for p in every})
            return [], f"unknown pattern {name!r}; known patterns and families: {', '.join(known)}"
        usable = {p.name for p in named} & enabled_names
        if not usable:
            needed = sorted({p.level for p in named})
            return [], f"pattern {name!r} is not enabled at level {level!r} (it needs --level {' or '.join(needed)})"
        selected |= usable
    return [p for p in enabled if p.name in selected], None


def select_graphs(graphs: list[CapturedGraph], names: Sequence[str] | None) -> tuple[list[CapturedGraph], str | None]:
    """The captured graphs named in ``names`` (all when None), or an error listing the graph names."""
    if not names:
        return graphs, None
    known = [g.name for g in graphs]
    unknown = [n for n in names if n not in known]
    if unknown:
        return [], f"unknown graph {', '.join(map(repr, unknown))}; this model's graphs: {', '.join(known)}"
    return [g for g in graphs if g.name in names], None


def near_miss_policy(enabled: bool, selected: Sequence[Pattern], patterns_named: bool) -> NearMissWanted:
    """Near misses of selected patterns: those with no match, or every one when patterns were named."""
    chosen = {p.name for p in selected}

    def wanted(pattern: Pattern, count: int) -> bool:
        return enabled and pattern.name in chosen and (patterns_named or count == 0)

    return wanted


# --------------------------------------------------------------------------------------------- output


def progress(message: str) -> None:
    """Progress and notes go to stderr (stdout holds only the report)."""
    print(f"rewrite-debug: {message}", file=sys.stderr, flush=True)


def shown(report: GraphReport, patterns: Sequence[Pattern]) -> GraphReport:
    """``report`` restricted to ``patterns`` (the counts of every pattern are kept in order)."""
    names = [p.name for p in patterns]
    return dataclasses.replace(
        report,
        matches={n: report.matches.get(n, 0) for n in names},
        near_misses={n: report.near_misses[n] for n in names if n in report.near_misses},
        subgraphs=[s for s in report.subgraphs if s.pattern in names])


def format_table(reports: Sequence[GraphReport], patterns: Sequence[Pattern], level: str) -> str:
    """Rows: the patterns shown (zero counts included); columns: the graphs."""
    header = ["pattern", *(r.name for r in reports)]
    rows = [[p.name, *(str(r.matches.get(p.name, 0)) for r in reports)] for p in patterns]
    rows.append(["nodes (captured -> rewritten)", *(f"{r.nodes} -> {r.nodes_after}" for r in reports)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)]
    if not patterns:
        lines.insert(2, f"(no patterns enabled at level {level!r})")
    return "\n".join(lines)


def format_subgraph(index: int, record: SubgraphRecord) -> str:
    """Pattern, graph, source module and class, then one line per node: name, op, shape, dtype."""
    note = "" if record.cross_check else "  [outside the pattern's module types]"
    lines = [f"{record.pattern} #{index} in {record.graph}: {record.module} ({record.module_type}){note}"]
    width_name = max(len(n.name) for n in record.nodes)
    width_op = max(len(n.op) for n in record.nodes)
    lines += [f"    {n.name.ljust(width_name)}  {n.op.ljust(width_op)}  {n.shape}  {n.dtype}" for n in record.nodes]
    if record.scalars:
        lines.append("    scalars: " + ", ".join(f"{k}={v!r}" for k, v in record.scalars.items()))
    return "\n".join(lines)


def format_near_misses(report: GraphReport) -> list[str]:
    lines = []
    for pattern, reasons in report.near_misses.items():
        lines.append(f"near misses of {pattern} in {report.name}:")
        if not reasons:
            lines.append("    (none: no candidate left; the graph lacks the pattern's ops or every candidate matched)")
        lines += [f"    - {reason}" for reason in reasons[:NEAR_MISSES_SHOWN]]
        if len(reasons) > NEAR_MISSES_SHOWN:
            lines.append(f"    ({len(reasons) - NEAR_MISSES_SHOWN} more; --json lists all)")
    return lines


def format_text(reports: Sequence[GraphReport], patterns: Sequence[Pattern], args: argparse.Namespace) -> str:
    lines = [f"{args.model} ({args.config}, {args.dtype}) at level {args.level}", "",
             format_table(reports, patterns, args.level)]
    for report in reports:
        counters: dict[str, int] = {}
        for record in report.subgraphs:
            counters[record.pattern] = counters.get(record.pattern, 0) + 1
            lines += ["", format_subgraph(counters[record.pattern], record)]
    near = [line for report in reports for line in format_near_misses(report)]
    if near:
        lines += ["", *near]
    return "\n".join(lines)


def to_json(reports: Sequence[GraphReport], args: argparse.Namespace) -> str:
    graphs = [{"name": r.name, "nodes": r.nodes, "nodes_after": r.nodes_after, "matches": r.matches,
               "near_misses": r.near_misses, "subgraphs": [dataclasses.asdict(s) for s in r.subgraphs]}
              for r in reports]
    return json.dumps({"model": args.model, "config": args.config, "level": args.level, "dtype": args.dtype,
                       "graphs": graphs}, indent=2)


# --------------------------------------------------------------------------------------------- files


def pattern_colors(patterns: Sequence[Pattern]) -> dict[str, str]:
    return {p.name: PALETTE[i % len(PALETTE)] for i, p in enumerate(patterns)}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


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


def write_dot_files(directory: Path, reports: Sequence[GraphReport], colors: dict[str, str]) -> list[Path]:
    """Per graph ``GRAPH.dot`` (matched nodes filled per pattern) and ``GRAPH.PATTERN.K.dot`` per match."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for report in reports:
        fill = {node: colors[pattern] for node, (pattern, _) in match_labels(report).items()}
        legend = [(name, color) for name, color in colors.items() if report.matches.get(name)]
        path = directory / f"{_slug(report.name)}.dot"
        path.write_text(to_dot(report.snapshot, report.name, fill, legend))
        written.append(path)
        counters: dict[str, int] = {}
        for record in report.subgraphs:
            counters[record.pattern] = counters.get(record.pattern, 0) + 1
            digraph, outside = subgraph_digraph(record, report.snapshot)
            title = f"{record.pattern} #{counters[record.pattern]} in {report.name}: {record.module}"
            fill = {n.name: colors[record.pattern] for n in record.nodes}
            path = directory / f"{_slug(report.name)}.{_slug(record.pattern)}.{counters[record.pattern]}.dot"
            path.write_text(to_dot(digraph, title, fill, dashed=outside))
            written.append(path)
    return written


def match_labels(report: GraphReport) -> dict[str, tuple[str, str]]:
    """Matched node -> ``(pattern, "pattern #k")`` for the nodes of the graph ``fuse_patterns`` received.

    A node created by an earlier replacement (an input of a later match) is not in that graph; it appears
    in the later match's subgraph file only.
    """
    labels: dict[str, tuple[str, str]] = {}
    counters: dict[str, int] = {}
    for record in report.subgraphs:
        counters[record.pattern] = counters.get(record.pattern, 0) + 1
        for node in record.nodes:
            if node.name in report.snapshot:
                labels[node.name] = (record.pattern, f"{record.pattern} #{counters[record.pattern]}")
    return labels


def write_graphml(path: Path, reports: Sequence[GraphReport]) -> None:
    """Every graph in one GraphML file: nodes ``GRAPH/NODE`` with a ``graph`` attribute, matched ones
    with ``pattern`` and ``match`` (``pattern #k``, as in the text report and the DOT file names)."""
    combined = nx.DiGraph()
    for report in reports:
        labels = match_labels(report)
        prefixed = nx.relabel_nodes(report.snapshot, {n: f"{report.name}/{n}" for n in report.snapshot})
        for node in report.snapshot:
            attributes = prefixed.nodes[f"{report.name}/{node}"]
            attributes.update(graph=report.name, name=node)
            if node in labels:
                attributes["pattern"], attributes["match"] = labels[node]
        combined = nx.compose(combined, prefixed)
    path.parent.mkdir(parents=True, exist_ok=True)
    nx.write_graphml(combined, path)


# --------------------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rewrite-debug", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("model", choices=sorted(MODELS), help="model to capture (random weights)")
    parser.add_argument("--config", choices=CONFIGS, default="tiny", help="model size (default tiny)")
    parser.add_argument("--level", choices=LEVELS, default="lossless", help="rewrite level (default lossless)")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32", help="capture dtype (default float32)")
    parser.add_argument("--graph", action="append", metavar="NAME", help="show only this graph (repeatable)")
    parser.add_argument("--pattern", action="append", metavar="NAME",
                        help="show only this pattern, by name or family (repeatable)")
    parser.add_argument("--near-misses", action="store_true",
                        help="why patterns did not match (those with no match, or every --pattern)")
    parser.add_argument("--dot", metavar="DIR", type=Path, help="write DOT files of the graphs and matches here")
    parser.add_argument("--graphml", metavar="FILE", type=Path, help="write the graphs as GraphML")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    parser.add_argument("--aten-activations", action="store_true",
                        help="auk: capture each alias-free activation as its ATen ops, not as one op node")
    return parser


def capture(args: argparse.Namespace) -> list[CapturedGraph]:
    start = time.perf_counter()
    progress(f"capturing {args.model} ({args.config}, {args.dtype}) on the CPU ...")
    graphs = MODELS[args.model](args.config, DTYPES[args.dtype], aten_activations=args.aten_activations)
    progress(f"captured {', '.join(f'{g.name} ({g.node_count} nodes)' for g in graphs)} "
             f"in {time.perf_counter() - start:.1f} s")
    return graphs


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rewrite-debug``; returns the exit status (2 for bad arguments, 1 for a failed pass)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    patterns, error = select_patterns(args.pattern, args.level)
    if error:
        parser.error(error)
    wanted = near_miss_policy(args.near_misses, patterns, patterns_named=bool(args.pattern))
    with contextlib.redirect_stdout(sys.stderr):  # whatever the libraries print stays off the report
        graphs, error = select_graphs(capture(args), args.graph)
        if error:
            parser.error(error)
        try:
            reports = [debug_graph(graph, args.level, wanted) for graph in graphs]
        except PassError as failure:
            traceback.print_exception(failure.__cause__ or failure, file=sys.stderr)
            progress(str(failure))
            return 1
        reports = [shown(report, patterns) for report in reports]
        if args.dot:
            written = write_dot_files(args.dot, reports, pattern_colors(patterns))
            progress(f"wrote {len(written)} DOT files to {args.dot}")
        if args.graphml:
            write_graphml(args.graphml, reports)
            progress(f"wrote {args.graphml}")
    print(to_json(reports, args) if args.json else format_text(reports, patterns, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
