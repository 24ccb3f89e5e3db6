"""Fuse matched subgraphs into custom ops, for the patterns enabled at the chosen level.

Matches: every pattern of ``rewrite.patterns.registry()`` whose minimum level ``ctx.level`` enables, in
registry order, each pattern re-matched on the graph as the previous ones left it.
Exactness: as declared by each pattern (``exact`` at ``lossless``; ``tolerance`` patterns only at levels
that allow them, by their declared level).
Requires: canonicalize ran (patterns are written against the canonical form) and every node has
``meta['val']``. Ensures: the graph lints and the module is recompiled once, after the last pattern; every
new node has ``val``, the anchor's ``nn_module_stack`` and ``meta['rewrite_pattern']``.
Stats: ``matches`` (pattern -> replaced), ``rejected`` (pattern -> [{node, reason}]), ``provenance``
(pattern -> [{node, module, type, cross_check}]), ``nodes_added``, ``nodes_erased``.
Observable: ``ctx.match_observer(pattern, match_result)`` runs before each pattern's matches are replaced.
"""

from __future__ import annotations

import torch.fx as fx

import rewrite.patterns as pattern_registry
from rewrite.engine.matcher import find_matches
from rewrite.engine.rewriter import replace_matches
from rewrite.levels import level_enables
from rewrite.passes.manager import PassContext, PassResult


def fuse_patterns(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    """Replace every match of the level's patterns by its custom op; see the module docstring."""
    enabled = [p for p in pattern_registry.registry() if level_enables(ctx.level, p.level)]
    stats: dict = {"matches": {}, "rejected": {}, "provenance": {}, "nodes_added": 0, "nodes_erased": 0}
    for pattern in enabled:
        result = find_matches(gm, pattern)
        if ctx.match_observer is not None:
            ctx.match_observer(pattern, result)
        stats["provenance"][pattern.name] = [
            {"node": m.anchor.name, "module": m.module_path, "type": m.module_type, "cross_check": m.cross_check()}
            for m in result.matches]
        stats["rejected"][pattern.name] = [{"node": r.match.anchor.name, "reason": r.reason} for r in result.rejected]
        counts = replace_matches(gm, result.matches, recompile=False)  # once, below: matching reads the graph
        stats["matches"][pattern.name] = counts.total
        stats["nodes_added"] += counts.nodes_added
        stats["nodes_erased"] += counts.nodes_erased
        disagreeing = [p["node"] for p in stats["provenance"][pattern.name] if not p["cross_check"]]
        if disagreeing:
            ctx.log.append(f"fuse_patterns: {pattern.name} matched outside {pattern.module_types} at {disagreeing}")
    changed = any(stats["matches"].values())
    if changed:
        gm.recompile()
    return PassResult(gm, changed, stats)
