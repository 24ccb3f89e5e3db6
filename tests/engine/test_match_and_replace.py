"""Pattern engine: matching (counts, bound scalars, multi-output, guards), near misses, replacement."""

from __future__ import annotations

from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rewrite.engine.matcher import find_matches
from rewrite.engine.pattern import Pattern, variants
from rewrite.engine.rewriter import replace_matches

aten = torch.ops.aten
MAX = 9223372036854775807


# --------------------------------------------------------------------------------------------- test ops


def _reference_norm(x: Tensor, gamma: Tensor, scale: float, bias: float) -> Tensor:
    """The same aten ops as the captured graph, so a reference op is bit-identical to it."""
    denom = aten.expand_as.default(aten.clamp_min.default(aten.linalg_vector_norm.default(x, 2.0, [1], True), 1e-12), x)
    return aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(aten.div.Tensor(x, denom), scale), gamma), bias)


@torch.library.custom_op("rewrite_test::rms_norm_act", mutates_args=())
def rms_norm_act(x: Tensor, gamma: Tensor, scale: float, bias: float, act: Optional[str]) -> Tensor:
    y = _reference_norm(x, gamma, scale, bias)
    return aten.silu.default(y) if act == "silu" else y


@rms_norm_act.register_fake
def _(x, gamma, scale, bias, act):
    return torch.empty_like(x)


@torch.library.custom_op("rewrite_test::rms_norm_silu_cache", mutates_args=())
def rms_norm_silu_cache(x: Tensor, gamma: Tensor, scale: float, bias: float) -> tuple[Tensor, Tensor]:
    y = aten.silu.default(_reference_norm(x, gamma, scale, bias))
    return y, y[:, :, -2:].clone()


@rms_norm_silu_cache.register_fake
def _(x, gamma, scale, bias):
    return torch.empty_like(x), torch.empty_like(x[:, :, -2:])


# --------------------------------------------------------------------------------------------- patterns


def search(x, gamma, scale, bias, act):
    norm = aten.linalg_vector_norm.default(x, 2.0, [1], True)
    denom = aten.expand_as.default(aten.clamp_min.default(norm, 1e-12), x)
    y = aten.mul.Tensor(aten.mul.Tensor(aten.div.Tensor(x, denom), scale), gamma)
    y = aten.add.Tensor(y, bias)
    return aten.silu.default(y) if act == "silu" else y


def replace(x, gamma, scale, bias, act):
    return torch.ops.rewrite_test.rms_norm_act.default(x, gamma, scale, bias, act)


def search_with_cache(x, gamma, scale, bias):
    y = search(x, gamma, scale, bias, "silu")
    return y, aten.clone.default(aten.slice.Tensor(y, 2, -2, MAX))


def replace_with_cache(x, gamma, scale, bias):
    out = torch.ops.rewrite_test.rms_norm_silu_cache.default(x, gamma, scale, bias)
    return out[0], out[1]


def norm_patterns(guard=None, **options):
    return variants(search, replace, guard, name="rms_norm_act", exactness="exact", level="lossless",
                    scalars=("scale", "bias"), module_types=("RMSNorm",), act=("silu", None), **options)


NORM_SILU, NORM_ONLY = norm_patterns()
NORM_CACHE = Pattern(name="rms_norm_silu_cache", search=search_with_cache, replace=replace_with_cache,
                     exactness="exact", level="lossless", scalars=("scale", "bias"))


# --------------------------------------------------------------------------------------------- models


class RMSNorm(nn.Module):
    def __init__(self, channels: int, scale: float, gamma_first: bool = False):
        super().__init__()
        self.gamma = nn.Parameter(torch.randn(channels, 1, 1, 1))
        self.scale, self.gamma_first = scale, gamma_first

    def forward(self, x):
        y = F.normalize(x.float(), dim=1).to(x.dtype) * self.scale
        return (self.gamma * y if self.gamma_first else y * self.gamma) + 0.0


class Block(nn.Module):
    def __init__(self, channels=4, scale=2.0, act="silu", cache=False, gamma_first=False):
        super().__init__()
        self.norm1 = RMSNorm(channels, scale, gamma_first)
        self.act = nn.SiLU() if act == "silu" else nn.ReLU() if act == "relu" else nn.Identity()
        self.cache = cache

    def forward(self, x):
        y = self.act(self.norm1(x))
        return (y, y[:, :, -2:].clone()) if self.cache else (y,)


class Decoder(nn.Module):
    def __init__(self, *blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        extra = []
        for block in self.blocks:
            x, *cache = block(x)
            extra += cache
        return (x, *extra)


def canonical(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """What canonicalize does to these graphs: drop metadata asserts and same-dtype `to`."""
    for node in list(gm.graph.nodes):
        if node.target is aten._assert_tensor_metadata.default:
            gm.graph.erase_node(node)
        elif node.target is aten.to.dtype and node.args[0].meta["val"].dtype == node.meta["val"].dtype:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def capture(model: nn.Module) -> torch.fx.GraphModule:
    x = torch.randn(2, 4, 3, 5, 5)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (x,), strict=False, dynamic_shapes=({0: batch},))
    return canonical(ep.module())


def node(gm: torch.fx.GraphModule, name: str) -> torch.fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


def run_both(model: nn.Module, gm: torch.fx.GraphModule, batch: int = 3):
    x = torch.randn(batch, 4, 3, 5, 5)
    with torch.no_grad():
        return model(x), gm(x)


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
