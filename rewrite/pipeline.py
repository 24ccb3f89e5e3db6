"""The pass pipeline applied to every captured graph, per level."""

from __future__ import annotations

from rewrite.capture.export import CapturedGraph
from rewrite.passes.canonicalize import canonicalize
from rewrite.passes.manager import PassContext, PassManager, PassSpec


def pipeline_for(level: str) -> PassManager:
    """canonicalize, then (once patterns exist for the level) fuse_patterns."""
    specs = [PassSpec("canonicalize", canonicalize)]
    return PassManager(specs)


def rewrite_graph(graph: CapturedGraph, level: str) -> None:
    """Run the level's passes over `graph` in place and record what they did on it."""
    ctx = PassContext(level=level, dtype=graph.dtype, device=graph.device)
    results = pipeline_for(level).run(graph.graph_module, ctx)
    graph.passes = [name for name, _ in results]
    for _, result in results:
        graph.matches.update(result.stats.get("matches", {}))
