"""The pass pipeline applied to every captured graph, per level."""

from __future__ import annotations

from rewrite.capture.export import CapturedGraph
from rewrite.models.wan.chain_block_norms import chain_block_norms
from rewrite.passes.canonicalize import canonicalize
from rewrite.passes.drop_clones import drop_redundant_clones
from rewrite.passes.fuse_patterns import fuse_patterns
from rewrite.passes.manager import PassContext, PassManager, PassSpec


def pipeline_for(level: str) -> PassManager:
    """canonicalize, then fuse_patterns (which enables the patterns of `level`), chain_block_norms (level
    ``channels_last``: links the residual blocks' fused ops), then drop_redundant_clones."""
    specs = [PassSpec("canonicalize", canonicalize), PassSpec("fuse_patterns", fuse_patterns, after=("canonicalize",)),
             PassSpec("chain_block_norms", chain_block_norms, after=("fuse_patterns",)),
             PassSpec("drop_redundant_clones", drop_redundant_clones, after=("chain_block_norms",))]
    return PassManager(specs)


def rewrite_graph(graph: CapturedGraph, level: str) -> None:
    """Run the level's passes over `graph` in place and record what they did on it."""
    ctx = PassContext(level=level, dtype=graph.dtype, device=graph.device)
    results = pipeline_for(level).run(graph.graph_module, ctx)
    graph.passes = [name for name, _ in results]
    for _, result in results:
        graph.matches.update(result.stats.get("matches", {}))
        for pattern, rejections in result.stats.get("rejected", {}).items():
            for rejection in rejections:  # counted per family: a pattern's name is its family's plus [variant]
                reasons = graph.declined.setdefault(pattern.split("[", 1)[0], {})
                reasons[rejection["reason"]] = reasons.get(rejection["reason"], 0) + 1
