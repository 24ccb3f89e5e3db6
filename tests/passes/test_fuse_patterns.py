"""The `fuse_patterns` pass: the level's patterns applied to a captured graph, and what it reports."""

from __future__ import annotations

import torch
from tests.engine.pattern_cases import (
    Block, Decoder, NORM_ONLY, NORM_SILU, capture, norm_patterns, run_both)



# --------------------------------------------------------------------------------------------- the pass


def test_fuse_patterns_applies_the_level_patterns_and_reports(monkeypatch):
    from rewrite import patterns
    from rewrite.passes.fuse_patterns import fuse_patterns
    from rewrite.passes.manager import PassContext

    def scale_below_three(match):
        return None if match.scalars["scale"] < 3 else "scale too large"

    registered = norm_patterns(scale_below_three)
    monkeypatch.setattr(patterns, "registry", lambda: registered)
    model = Decoder(Block(scale=2.0), Block(scale=3.0, act=None), Block(scale=4.0))
    gm = capture(model)

    off = fuse_patterns(gm, PassContext(level="off"))
    assert not off.changed and off.stats["matches"] == {}

    result = fuse_patterns(gm, PassContext(level="lossless"))
    assert result.changed
    assert result.stats["matches"] == {NORM_SILU.name: 1, NORM_ONLY.name: 0}
    assert [r["reason"] for r in result.stats["rejected"][NORM_SILU.name]] == ["guard failed: scale too large"]
    [provenance] = result.stats["provenance"][NORM_SILU.name]
    assert provenance["module"] == "blocks.0" and provenance["cross_check"]
    reference, rewritten = run_both(model, gm)
    assert torch.equal(reference[0], rewritten[0])
