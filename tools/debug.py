"""`rewrite-debug`: which patterns match where in a decoder's captured graphs, and why the others do not.

Builds the model with random weights (nothing is downloaded; `rewrite.supported` lists the models), captures
its graphs on the CPU (export runs on fake tensors, so the full-size configs take seconds too; the full AuK
decoder is captured from the meta device) and runs the level's own pipeline on each graph, observing
``fuse_patterns`` (`rewrite.explain`). Every pattern runs, whatever ``--pattern`` selects, so the counts are
the pipeline's; the filters only choose what is shown. Arguments are checked before the capture.

Output (a summary by default): the symbolic sizes by name (batch, height, width; frames for AuK) and the
graphs' input, a pattern family x graph table of how many times each family matched and how many candidates
it declined (rows: the families with a pattern that applies to the model, level, dtype and device, zeros
included; ``--all-patterns`` adds the others with why each does not apply), the graphs' tensor ops captured
and rewritten (counted as `rewrite.report` counts them), and with ``--near-misses`` how many candidates of
each applicable pattern that matched nowhere came close, by kind (``174 x expected aten.expand.default but
found placeholder``). ``--details`` prints instead a pattern x graph table, every matched subgraph with its
nodes' inputs by name and the matches it combines, and with ``--near-misses`` each near miss (up to
``NEAR_MISSES_SHOWN`` per pattern and graph). ``--json`` prints one JSON object with all of it (progress and
notes go to stderr). ``--dot DIR`` writes ``GRAPH.dot`` (the graph as ``fuse_patterns`` received it, one
colour per pattern, a box per match) and ``GRAPH.PATTERN.K.dot`` per match; ``--graphml FILE`` writes the
same whole graphs with ``pattern`` and ``match`` attributes on matched nodes. A reader that closes stdout
early (``| head``) ends the run quietly with exit status 141 (`rewrite.tools.cli_output`).

Usage: ``rewrite-debug wan2.1 [--config full] [--pattern rms_norm --near-misses] [--details] [--json]``,
``rewrite-debug auk [--config full] [--level channels_last]`` (one graph, ``decode``), ``rewrite-debug wan2.1
--encoder`` (the encoder's step graphs, ``encode_chunk0`` and ``encode_steady``: captured and matched, not yet
served by `optimize`).

``--aten-activations`` (AuK) captures each alias-free activation as its 15 ATen ops, the
``alias_free_activation[..., aten]`` patterns' form, instead of the one op node `optimize` captures.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

import torch

from rewrite import explain, supported
from rewrite.capture.export import CapturedGraph
from rewrite.engine.pattern import Pattern
from rewrite.levels import LEVELS
from rewrite.passes.manager import PassError
from rewrite.reporting import op_count
from rewrite.tools.cli_output import emit, quiet_when_stdout_closes


def progress(message: str) -> None:
    """Progress and notes go to stderr (stdout holds only the report)."""
    print(f"rewrite-debug: {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rewrite-debug", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("model", choices=supported.names(), help="model to capture (random weights)")
    parser.add_argument("--config", choices=supported.CONFIGS, default="tiny", help="model size (default tiny)")
    parser.add_argument("--level", choices=LEVELS, default="lossless", help="rewrite level (default lossless)")
    parser.add_argument("--dtype", choices=list(supported.DTYPES), default="float32",
                        help="capture dtype (default float32)")
    parser.add_argument("--graph", action="append", metavar="NAME", help="show only this graph (repeatable)")
    parser.add_argument("--pattern", action="append", metavar="NAME",
                        help="show only this pattern, by name or family (repeatable)")
    parser.add_argument("--all-patterns", action="store_true",
                        help="also list the patterns that do not apply here, with why (another model, level, "
                             "dtype or device)")
    parser.add_argument("--near-misses", action="store_true",
                        help="why patterns did not match (applicable ones with no match, or every --pattern): "
                             "counts by kind, each near miss with --details")
    parser.add_argument("--details", action="store_true",
                        help="a row per pattern (not per family) and every match with its nodes; the default is "
                             "the summary per family and graph")
    parser.add_argument("--dot", metavar="DIR", type=Path, help="write DOT files of the graphs and matches here")
    parser.add_argument("--graphml", metavar="FILE", type=Path, help="write the graphs as GraphML")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (everything --details shows, and more) instead of the text")
    parser.add_argument("--aten-activations", action="store_true",
                        help="auk: capture each alias-free activation as its ATen ops, not as one op node")
    parser.add_argument("--encoder", action="store_true",
                        help="the encoder's step graphs instead of the decoder's (Wan, Qwen-Image; not served yet)")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
               model: supported.SupportedModel) -> list[Pattern]:
    """Every argument checked before the capture (exit 2 with the usage); returns the patterns picked."""
    picked, error = explain.select_patterns(args.pattern, args.level, every_level=args.all_patterns)
    if args.encoder and model.encoder is None:
        parser.error(f"--encoder: {args.model} has no encoder capture (models with one: "
                     f"{', '.join(m.name for m in supported.MODELS if m.encoder is not None)})")
    graph_names = model.encoder.graph_names if args.encoder else model.graph_names
    error = error or explain.graph_name_error(args.graph, graph_names)
    if error:
        parser.error(error)
    if args.aten_activations and "activations_as_ops" not in model.capture_options:
        parser.error(f"--aten-activations is for models with alias-free activations (auk), not {args.model}")
    if args.dot is not None and args.dot.exists() and not args.dot.is_dir():
        parser.error(f"--dot {args.dot} is a file; give a directory (it gets one .dot file per graph and per match)")
    if args.graphml is not None:
        if args.graphml.is_dir():
            parser.error(f"--graphml {args.graphml} is a directory; give a file name")
        blocked = next((p for p in args.graphml.parents if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            parser.error(f"--graphml {args.graphml}: {blocked} is a file, not a directory")
    return picked


def capture_graphs(model: supported.SupportedModel, config: str, dtype: torch.dtype,
                   aten_activations: bool = False, encoder: bool = False) -> list[CapturedGraph]:
    """The model's graphs as `optimize` captures them (random weights), on the CPU or, where the model
    captures from the meta device, there for the full config (no weights allocated); with `encoder`, its
    encoder's step graphs (`SupportedModel.encoder`)."""
    device = torch.device("meta" if config == "full" and model.meta_capture else "cpu")
    module = model.build(config, device=device, dtype=dtype)
    if encoder:
        return model.encoder.capture_graphs(module, dtype, device)
    options = {"activations_as_ops": False} if aten_activations else {}
    return model.capture(module, dtype, device, **options)


def capture(args: argparse.Namespace, model: supported.SupportedModel) -> list[CapturedGraph]:
    start = time.perf_counter()
    what = f"{args.model}'s encoder" if args.encoder else args.model
    progress(f"capturing {what} ({args.config}, {args.dtype}) on the CPU ...")
    graphs = capture_graphs(model, args.config, supported.DTYPES[args.dtype], aten_activations=args.aten_activations,
                            encoder=args.encoder)
    progress(f"captured {', '.join(f'{g.name} ({op_count(g.graph_module.graph)} tensor ops)' for g in graphs)} "
             f"in {time.perf_counter() - start:.1f} s")
    return [g for g in graphs if not args.graph or g.name in args.graph]


@quiet_when_stdout_closes
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``rewrite-debug``; returns the exit status (2 for bad arguments, 1 for a failed pass,
    `rewrite.tools.cli_output.BROKEN_PIPE_STATUS` when stdout's reader stops early)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    model = supported.get(args.model)
    picked = check_args(parser, args, model)
    universe, _ = explain.select_patterns(args.pattern, args.level, every_level=True)
    wanted = explain.near_miss_policy(args.near_misses, picked, patterns_named=bool(args.pattern))
    with contextlib.redirect_stdout(sys.stderr):  # whatever the libraries print stays off the report
        graphs = capture(args, model)
        try:
            dims = model.encoder.input_dims if args.encoder else model.latent_dims
            reports = [explain.explain_graph(graph, args.level, wanted, dims) for graph in graphs]
        except PassError as failure:
            traceback.print_exception(failure.__cause__ or failure, file=sys.stderr)
            progress(str(failure))
            return 1
        reasons = explain.not_applicable(universe, reports, args.level)
        rows = [p for p in picked if p.name not in reasons]
        if args.all_patterns or (args.pattern and not rows):  # named patterns that cannot apply are shown, with why
            rows = picked
        hidden = {p.name: reasons[p.name] for p in universe if p not in rows and p.name in reasons}
        if not args.pattern:
            reports = explain.without_graph_specific_near_misses(reports)
        reports = [explain.shown(report, rows) for report in reports]
        if args.dot:
            written = explain.write_dot_files(args.dot, reports, explain.pattern_colors(reports))
            progress(f"wrote {len(written)} DOT files to {args.dot}")
        if args.graphml:
            explain.write_graphml(args.graphml, reports)
            progress(f"wrote {args.graphml}")
    heading = explain.Heading(f"{args.model} encoder" if args.encoder else args.model, args.config, args.dtype,
                              args.level)
    if args.json:
        emit(explain.to_json(heading, reports, reasons))
    else:
        row_reasons = {p.name: reasons[p.name] for p in rows if p.name in reasons}
        text = explain.format_text if args.details else explain.format_summary
        emit(text(heading, reports, rows, hidden, row_reasons if row_reasons or args.all_patterns else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
