"""Matching (`rewrite.engine.matcher`): counts, bound scalars, variants, multi-output, guards, in-place ops, near
misses, optional inputs."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rewrite.engine.matcher import find_matches
from rewrite.engine.pattern import Pattern, variants
from rewrite.engine.rewriter import replace_matches
from tests.engine.pattern_cases import (
    Block, Decoder, MAX, NORM_CACHE, NORM_ONLY, NORM_SILU, RMSNorm, canonical, capture, norm_patterns, replace,
    replace_with_cache, run_both, search)

aten = torch.ops.aten


# --------------------------------------------------------------------------------------------- matching


def test_one_pattern_matches_every_site_and_binds_each_scale():
    gm = capture(Decoder(Block(scale=2.0), Block(scale=3.0)))
    result = find_matches(gm, NORM_SILU)
    assert len(result.matches) == 2 and not result.rejected
    assert [m.scalars for m in result.matches] == [{"scale": 2.0, "bias": 0.0}, {"scale": 3.0, "bias": 0.0}]
    first = result.matches[0]
    assert first.anchor.target is aten.silu.default
    assert set(first.inputs) == {"x", "gamma"} and first.inputs["gamma"].op == "get_attr"
    assert (first.module_path, first.module_type.rsplit(".", 1)[-1]) == ("blocks.0", "Block")
    assert first.cross_check()



class NormArgs(NamedTuple):
    """A norm's arguments as one typed parameter of a pattern: a tensor field and two literal ones."""

    gamma: Tensor
    scale: float
    bias: float


def test_a_named_tuple_parameter_is_one_placeholder_per_field_and_types_say_which_are_literals():
    def grouped_search(x, norm: NormArgs, act):
        return search(x, *norm, act)

    def grouped_replace(x, norm: NormArgs, act):
        return replace(x, *norm, act)

    silu, _ = variants(grouped_search, grouped_replace, name="grouped", exactness="exact", level="lossless",
                       act=("silu", None))
    assert silu.inputs == ("x", "gamma", "scale", "bias") and silu.scalars == ("scale", "bias")
    assert str(silu.search_graph) == str(NORM_SILU.search_graph)
    gm = capture(Decoder(Block(scale=2.0), Block(scale=3.0)))
    assert [m.scalars for m in find_matches(gm, silu).matches] == [m.scalars for m in find_matches(gm, NORM_SILU).matches]

    def second(x, norm2: NormArgs):  # a trailing number names the fields of its group apart
        return search(x, *norm2, None)

    pattern = Pattern(name="second", search=second, replace=second, exactness="exact", level="lossless")
    assert pattern.inputs == ("x", "gamma2", "scale2", "bias2") and pattern.scalars == ("scale2", "bias2")

    def ambiguous(x, norm: NormArgs, other: NormArgs):  # both would bind gamma, scale, bias
        return search(x, *norm, None)

    with pytest.raises(ValueError, match="same placeholder names"):
        Pattern(name="ambiguous", search=ambiguous, replace=ambiguous, exactness="exact", level="lossless")

def test_cross_check_flags_a_match_from_an_unexpected_module():
    gm = capture(Decoder(Block()))
    other, _ = variants(search, replace, name="elsewhere", exactness="exact", level="lossless",
                        scalars=("scale", "bias"), module_types=("Attention",), act=("silu", None))
    assert not find_matches(gm, other).matches[0].cross_check()


def test_variants_cover_axes_and_commuted_operands():
    patterns = norm_patterns(commute=("mul",))
    assert [p.name for p in patterns] == [
        "rms_norm_act[act=silu]", "rms_norm_act[act=silu, swap mul#2]",
        "rms_norm_act[act=None]", "rms_norm_act[act=None, swap mul#2]"]
    gm = capture(Decoder(Block(gamma_first=True)))
    counts = {p.name: len(find_matches(gm, p).matches) for p in patterns}
    assert counts["rms_norm_act[act=silu, swap mul#2]"] == 1
    assert counts["rms_norm_act[act=silu]"] == 0


def test_norm_only_variant_matches_what_the_silu_variant_left():
    model = Decoder(Block(), Block(act=None), Block())
    gm = capture(model)
    assert replace_matches(gm, find_matches(gm, NORM_SILU).matches).replaced == {NORM_SILU.name: 2}
    assert replace_matches(gm, find_matches(gm, NORM_ONLY).matches).replaced == {NORM_ONLY.name: 1}
    reference, rewritten = run_both(model, gm)
    assert torch.equal(reference[0], rewritten[0])


def test_output_with_users_outside_the_match_is_rerouted():
    model = Decoder(Block(cache=True), Block(cache=True))
    gm = capture(model)
    matches = find_matches(gm, NORM_SILU).matches
    assert len(matches) == 2
    assert any(u.target is aten.slice.Tensor for u in matches[0].anchor.users)
    replace_matches(gm, matches)
    slices = [n for n in gm.graph.nodes if n.target is aten.slice.Tensor]
    assert all(s.args[0].target is torch.ops.rewrite_test.rms_norm_act.default for s in slices)
    for a, b in zip(*run_both(model, gm)):
        assert torch.equal(a, b)


def test_multi_output_pattern_replaces_both_outputs():
    model = Decoder(Block(cache=True), Block(cache=True, scale=5.0))
    gm = capture(model)
    result = find_matches(gm, NORM_CACHE)
    assert len(result.matches) == 2
    assert [o.target for o in result.matches[0].outputs] == [aten.silu.default, aten.clone.default]
    counts = replace_matches(gm, result.matches)
    assert counts.replaced == {"rms_norm_silu_cache": 2} and counts.nodes_added == 6
    assert not any(n.target in (aten.silu.default, aten.clone.default) for n in gm.graph.nodes)
    for a, b in zip(*run_both(model, gm)):
        assert torch.equal(a, b)


def test_later_anchors_try_only_candidates_that_match_alone(monkeypatch):
    """A multi-output pattern: the same matches as SubgraphMatcher's plain backtracking, with fewer node
    comparisons (each later anchor's candidates are cut to those that match alone first)."""
    from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

    from rewrite.engine import matcher

    class TwoSinks(Block):  # the norm's output and a copy of its input's last frames: two pattern sinks
        def forward(self, x):  # (and copies of other frames, which the second sink's candidates include)
            return self.act(self.norm1(x)), x[:, :, -2:].clone(), *(x[:, :, i : i + 1].clone() for i in range(3))

    def search_two(x, gamma, scale, bias):
        return search(x, gamma, scale, bias, "silu"), aten.clone.default(aten.slice.Tensor(x, 2, -2, MAX))

    two = Pattern(name="two_sinks", search=search_two, replace=replace_with_cache, exactness="exact",
                  level="lossless", scalars=("scale", "bias"))
    gm = capture(Decoder(*(TwoSinks(scale=s) for s in (2.0, 3.0, 4.0, 5.0))))
    calls = []
    original = SubgraphMatcher._match_nodes
    monkeypatch.setattr(SubgraphMatcher, "_match_nodes", lambda self, *args: calls.append(1) or original(self, *args))

    def found():
        calls.clear()
        result = find_matches(gm, two)
        return [[(p.name, g.name) for p, g in m.nodes.items()] for m in result.matches], len(calls)

    cut, cut_calls = found()
    monkeypatch.setattr(matcher._LiteralPlaceholderMatcher, "match", SubgraphMatcher.match)
    plain, plain_calls = found()
    assert len(cut) == 4 and cut == plain and cut_calls < plain_calls


def test_outside_user_placed_between_the_outputs_is_reordered_after_the_replacement():
    class ScaledThenCached(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            (y,) = self.block(x)
            scaled = y * 2.0  # placed before the cache slice: the replacement is inserted after the clone
            return scaled, y[:, :, -2:].clone()

    model = ScaledThenCached()
    gm = capture(model)
    replace_matches(gm, find_matches(gm, NORM_CACHE).matches)
    order = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert order.index(aten.mul.Tensor) > order.index(torch.ops.rewrite_test.rms_norm_silu_cache.default)
    for a, b in zip(*run_both(model, gm)):
        assert torch.equal(a, b)


def test_internal_node_used_outside_is_rejected_with_reason():
    class Leaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = RMSNorm(4, 2.0)

        def forward(self, x):
            y = self.norm1(x)
            return F.silu(y), y

    result = find_matches(capture(Leaky()), NORM_SILU)
    assert not result.matches
    [rejection] = result.rejected
    assert "node add " in rejection.reason and "outside the match" in rejection.reason


def test_guard_drops_a_match_and_records_why():
    def positive_scale(match):
        return None if match.scalars["scale"] > 0 else f"scale {match.scalars['scale']} is not positive"

    guarded, _ = norm_patterns(positive_scale)
    gm = capture(Decoder(Block(scale=2.0), Block(scale=-1.0)))
    result = find_matches(gm, guarded)
    assert [m.scalars["scale"] for m in result.matches] == [2.0]
    [rejection] = result.rejected
    assert rejection.reason == "guard failed: scale -1.0 is not positive"
    miss = result.near_miss()
    assert miss.matched_count == 8 and "guard failed: scale -1.0" in miss.reason


def test_inplace_variant_matches_inplace_ops():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = RMSNorm(4, 2.0)

        def forward(self, x):
            y = F.normalize(x, dim=1) * 2.0 * self.norm1.gamma
            y += 0.0
            return F.silu(y, inplace=True)

    patterns = norm_patterns(inplace=("add", "silu"))
    assert "rms_norm_act[act=silu, add_, silu_]" in [p.name for p in patterns]
    model = InPlace()
    gm = capture(model)
    matched = {p.name: len(find_matches(gm, p).matches) for p in patterns}
    assert matched["rms_norm_act[act=silu, add_, silu_]"] == 1 and matched[NORM_SILU.name] == 0
    replace_matches(gm, find_matches(gm, next(p for p in patterns if p.name.endswith("add_, silu_]"))).matches)
    assert torch.equal(*run_both(model, gm))


def test_inplace_write_into_an_input_read_elsewhere_is_rejected():
    def residual(h, x):
        return aten.silu.default(aten.add_.Tensor(h, x))

    pattern = Pattern(name="residual_silu", search=residual, replace=residual, exactness="exact", level="lossless")

    class Residual(nn.Module):
        def forward(self, x):
            h = x * 3.0
            seen = h * 2.0
            h += x
            return F.silu(h), seen

    gm = capture(Residual())
    result = find_matches(gm, pattern)
    assert not result.matches and "writes into input mul" in result.rejected[0].reason


# --------------------------------------------------------------------------------------------- near misses


def test_near_miss_names_the_diverging_node_and_the_expected_op():
    gm = capture(Decoder(Block(act="relu")))
    result = find_matches(gm, NORM_SILU)
    assert not result.matches
    miss = result.near_miss()
    assert miss.diverged_at.name == "add" and miss.matched_count == 7
    assert (miss.expected, miss.found) == ("aten.silu.default", "aten.relu.default")
    assert "at node add (aten.add.Tensor, from blocks.0.norm1): expected aten.silu.default but found " \
           "aten.relu.default" in miss.reason


def test_near_miss_reports_a_node_where_a_literal_was_expected():
    class TensorScale(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = RMSNorm(4, 2.0)
            self.register_buffer("scale", torch.tensor(2.0))

        def forward(self, x):
            return F.silu(F.normalize(x, dim=1) * self.scale * self.norm1.gamma + 0.0)

    miss = find_matches(capture(TensorScale()), NORM_SILU).near_miss()
    assert miss.expected == "literal placeholder scale" and miss.found.startswith("node ")
    assert miss.diverged_at.target is aten.mul.Tensor


def test_near_miss_reports_a_different_literal():
    class Eps(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = RMSNorm(4, 2.0)

        def forward(self, x):
            return F.silu(F.normalize(x, dim=1, eps=1e-6) * 2.0 * self.norm1.gamma + 0.0)

    miss = find_matches(capture(Eps()), NORM_SILU).near_miss()
    assert miss.diverged_at.target is aten.clamp_min.default
    assert (miss.expected, miss.found) == ("literal 1e-12", "literal 1e-06")


def test_near_misses_are_computed_only_when_asked():
    result = find_matches(capture(Decoder(Block(act="relu"))), NORM_SILU)
    assert result._near is None
    result.near_misses()
    assert result._near is not None


# --------------------------------------------------------------------------------------------- optional inputs


def _conv_search(x, weight, bias, residual):
    y = aten.conv1d.default(x, weight, bias, [1], [0], [1], 1)
    return y if residual is None else aten.add.Tensor(residual, y)


def _conv_replace(x, weight, bias, residual):
    y = aten.convolution.default(x, weight, bias, [1], [0], [1], False, [0], 1)  # not matched again
    return y if residual is None else aten.add.Tensor(residual, y)


class ConvChain(nn.Module):
    """conv(+bias) + residual, conv without bias (no residual), conv(+bias) alone."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Conv1d(4, 4, 3), nn.Conv1d(4, 4, 3, bias=False), nn.Conv1d(4, 4, 3)

    def forward(self, x):
        y = x[..., 2:] + self.a(x)
        return self.c(self.b(y))


def test_optional_inputs_make_present_and_absent_variants_larger_first():
    patterns = variants(_conv_search, _conv_replace, name="conv", exactness="exact", level="lossless",
                        optional=("residual", "bias"))
    assert [p.name for p in patterns] == ["conv", "conv[bias=None]", "conv[residual=None]",
                                          "conv[residual=None, bias=None]"]
    assert [p.inputs for p in patterns] == [("x", "weight", "bias", "residual"), ("x", "weight", "residual"),
                                            ("x", "weight", "bias"), ("x", "weight")]
    x = torch.randn(2, 4, 9)
    gm = canonical(torch.export.export(ConvChain(), (x,), strict=False).module())
    counts = {}
    for pattern in patterns:  # in order, each on what the previous ones left
        counts[pattern.name] = replace_matches(gm, find_matches(gm, pattern).matches).total
    assert counts == {"conv": 1, "conv[bias=None]": 0, "conv[residual=None]": 1, "conv[residual=None, bias=None]": 1}
    model = ConvChain()
    gm = canonical(torch.export.export(model, (x,), strict=False).module())
    for pattern in patterns:
        replace_matches(gm, find_matches(gm, pattern).matches)
    with torch.no_grad():
        assert torch.equal(gm(x), model(x))
