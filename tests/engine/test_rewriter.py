"""Replacing matches (`rewrite.engine.rewriter`): the replacement linted, symbolic values and provenance
propagated, the result exact; values computed without the fake-tensor cache; pattern definition errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewrite.engine.matcher import find_matches
from rewrite.engine.pattern import Pattern
from rewrite.engine.rewriter import replace_matches
from tests.engine.pattern_cases import (
    Block, Decoder, NORM_CACHE, NORM_SILU, capture, norm_patterns, replace, replace_with_cache, run_both,
    search, search_with_cache)


# --------------------------------------------------------------------------------------------- replacement


def test_replacement_lints_propagates_symbolic_vals_and_provenance_and_is_exact():
    model = Decoder(Block(scale=2.0), Block(scale=3.0), Block(scale=0.5))
    gm = capture(model)
    before = len(gm.graph.nodes)
    counts = replace_matches(gm, find_matches(gm, NORM_SILU).matches)
    assert counts.replaced == {NORM_SILU.name: 3} and counts.nodes_erased == 3 * 8 and counts.nodes_added == 3
    assert len(gm.graph.nodes) == before - 3 * 7
    gm.graph.lint()
    fused = [n for n in gm.graph.nodes if n.meta.get("rewrite_pattern") == NORM_SILU.name]
    assert [n.args[2] for n in fused] == [2.0, 3.0, 0.5] and all(n.args[4] == "silu" for n in fused)
    for n in fused:
        assert isinstance(n.meta["val"].shape[0], torch.SymInt) and n.meta["val"].dtype == torch.float32
        assert list(n.meta["nn_module_stack"].values())[-1][0].endswith(".act")
        assert "stack_trace" in n.meta
    reference, rewritten = run_both(model, gm, batch=5)
    assert torch.equal(reference[0], rewritten[0])


def test_replacement_vals_are_computed_without_the_fake_tensor_cache(monkeypatch):
    """With symbolic sizes almost every cached dispatch misses and still builds an entry: the rewriter turns the
    graph's fake mode's cache off while it computes the new nodes' values, and back on after."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    gm = capture(Decoder(Block(cache=True), Block(cache=True, scale=5.0)))
    mode = next(n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder").fake_mode
    mode.cache_enabled = True
    cached = []
    original = FakeTensorMode._cached_dispatch_impl
    monkeypatch.setattr(FakeTensorMode, "_cached_dispatch_impl",
                        lambda self, *args: cached.append(args[0]) or original(self, *args))
    assert replace_matches(gm, find_matches(gm, NORM_CACHE).matches).replaced == {"rms_norm_silu_cache": 2}
    assert cached == [] and mode.cache_enabled


def test_pattern_definition_errors_are_clear():
    with pytest.raises(ValueError, match="exactness"):
        Pattern(name="p", search=search, replace=replace, exactness="close", level="lossless")
    with pytest.raises(ValueError, match="level"):
        Pattern(name="p", search=search_with_cache, replace=replace_with_cache, exactness="exact", level="off")
    with pytest.raises(ValueError, match="same parameters"):
        Pattern(name="p", search=search_with_cache, replace=replace, exactness="exact", level="lossless")
    with pytest.raises(ValueError, match="torch.ops.aten"):
        Pattern(name="p", search=lambda x: F.silu(x), replace=lambda x: x, exactness="exact", level="lossless")
    with pytest.raises(ValueError, match="more than 4 variants"):
        norm_patterns(inplace=True, max_variants=4)
