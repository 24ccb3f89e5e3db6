"""Structural goldens of the Wan pattern families, guards and near misses on real captured graphs."""

from __future__ import annotations

import pytest
import torch

from rewrite import report
from rewrite.models.wan.capture import capture_wan_decoder
from rewrite.engine.matcher import find_matches
from rewrite.models.wan.config import build_wan
from rewrite.passes.canonicalize import canonicalize
from rewrite.patterns import registry
from rewrite.pipeline import rewrite_graph
from tests.captures import tiny_wan


def _family_counts(matches: dict[str, int]) -> dict[str, int]:
    """`rms_norm[act=silu, half=None]` -> `rms_norm[act=silu]`: drop the dtype axis, sum, drop zeros."""
    counts: dict[str, int] = {}
    for name, count in matches.items():
        key = name.replace(", half=None", "").replace(", half=torch.bfloat16", "").replace(", half=torch.float16", "")
        key = key.replace("[upcast=True]", "").replace("[upcast=False]", "")
        if count:
            counts[key] = counts.get(key, 0) + count
    return counts


def _expected(norms: int, caches_t1: int, caches: int, residuals: int, shortcuts: int, wan22: bool,
              deferred_biases: bool = False) -> dict[str, dict[str, int]]:
    # the resnets that change the channel count have a 1x1x1 shortcut conv (`pointwise_conv3d`)
    common = {"rms_norm[act=silu]": norms, "rms_norm[act=None]": 1, "conv3d_residual": residuals,
              "upsample_nearest2x": 3, "upsample_conv2d": 3, "pointwise_conv3d": shortcuts}
    # chunk 0: the two temporal upsamplers only mark their slot ("Rep") and run no causal conv
    # every causal conv then takes its input assembly in (`causal_conv3d`), with or without the residual
    chunk0 = dict(common, **{"causal_conv_input[mode=chunk0]": caches_t1 + caches - 2,
                             "causal_conv3d[cache=None]": residuals,
                             "causal_conv3d[residual=None, cache=None]": caches_t1 + caches - 2 - residuals})
    steady = dict(common, **{"causal_conv_input[mode=steady_t1]": caches_t1,
                             "causal_conv_input[mode=steady]": caches, "temporal_interleave": 2,
                             "causal_conv3d": residuals, "causal_conv3d[residual=None]": caches_t1 + caches - residuals})
    # every norm + SiLU feeds a causal conv, and the two ops then fuse (`rms_norm_causal_conv3d`)
    chunk0.update({"rms_norm_causal_conv3d[cache=None]": residuals,
                   "rms_norm_causal_conv3d[residual=None, cache=None]": norms - residuals})
    steady.update({"rms_norm_causal_conv3d": residuals, "rms_norm_causal_conv3d[residual=None]": norms - residuals})
    if deferred_biases:  # CUDA graphs: each shortcut conv's bias moves into the epilogue that adds it, and
        # every block's first conv bias into the norm reading that conv's output (`norm_input_bias_identity`
        # where the residual is the block input)
        chunk0.update({"residual_bias[cache=None, x_bias=None]": shortcuts,
                       "norm_input_bias[cache=None, cache2=None]": shortcuts,
                       "norm_input_bias_identity[cache=None, cache2=None]": residuals - shortcuts})
        steady.update({"residual_bias[x_bias=None]": shortcuts, "norm_input_bias": shortcuts,
                       "norm_input_bias_identity": residuals - shortcuts})
    if wan22:
        chunk0.update({"dup_up_add[chunk=steady]": 1, "dup_up_add[chunk=first]": 2})
        steady["dup_up_add[chunk=steady]"] = 3
        # each up block's upsampler conv then takes its DupUp3D shortcut add into its epilogue
        chunk0["upsample_conv2d_dup_up_add"] = steady["upsample_conv2d_dup_up_add"] = 3
    return {"chunk0": chunk0, "steady": steady}


# Full size: every RMS norm matched (29 with SiLU, 1 without: the attention's), 32 cache slots.
FULL = {"wan2.1": _expected(29, 12, 20, 14, 1, False), "wan2.2": _expected(29, 12, 20, 14, 2, True)}
TINY = {"wan2.1": _expected(21, 10, 14, 10, 2, False), "wan2.2": _expected(21, 10, 14, 10, 1, True)}


@pytest.mark.slow  # captures the full-size decoders
@pytest.mark.parametrize("version", ("wan2.1", "wan2.2"))
def test_full_size_match_counts(version):
    vae = build_wan(version, "full", perturb_norms=False)
    graphs = capture_wan_decoder(vae.decoder, torch.float32, torch.device("cpu"))
    for graph in graphs:
        rewrite_graph(graph, "lossless")
        assert _family_counts(graph.matches) == FULL[version][graph.name], graph.name


@pytest.mark.parametrize("version", ("wan2.1", "wan2.2"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_tiny_match_counts_per_dtype(wan_pair, version, dtype):
    pair = wan_pair(version, dtype)
    pair.decode_both(pair.latents(1, 2))
    graphs = [g for g in report(pair.optimized).graphs if g.dtype == str(dtype)]
    assert {g.name for g in graphs} == {"chunk0", "steady"}
    for graph in graphs:
        assert _family_counts(graph.matches) == TINY[version][graph.name], graph.name
        half = "None" if dtype == torch.float32 else str(dtype)
        assert all(f"half={half}" in name for name, n in graph.matches.items() if n and name.startswith("rms_norm["))


@pytest.mark.parametrize("version", ("wan2.1", "wan2.2"))
def test_deferred_bias_families_match_every_block_of_cuda_graphs(monkeypatch, version):
    """On CUDA graphs every residual block's first conv bias moves into the second norm and every shortcut
    conv's bias into the epilogue; CPU graphs keep them (the CPU conv may fold its bias into the sum). The
    CPU capture stands in for a CUDA one here (the guards' device test patched): structure only."""
    from rewrite.ops import dispatch

    monkeypatch.setattr(dispatch, "conv_bias_is_separate", lambda device: True)
    shortcuts = 2 if version == "wan2.1" else 1
    expected = _expected(21, 10, 14, 10, shortcuts, version == "wan2.2", deferred_biases=True)
    for graph in tiny_wan(version)[1]:
        rewrite_graph(graph, "lossless")
        assert _family_counts(graph.matches) == expected[graph.name], graph.name


@pytest.fixture(scope="module")
def canonical_wan21():
    graphs = {g.name: g for g in tiny_wan("wan2.1")[1]}
    for graph in graphs.values():
        canonicalize(graph.graph_module)
    return graphs


def _pattern(name: str):
    return next(p for p in registry() if p.name == name)


def test_guard_rejects_single_frame_chunks_for_the_multi_frame_mode(canonical_wan21):
    result = find_matches(canonical_wan21["steady"].graph_module, _pattern("causal_conv_input[mode=steady]"))
    assert len(result.matches) == 14
    assert result.rejected and all("expects >= 2 frames, x has 1" in r.reason for r in result.rejected)


def test_near_miss_names_the_diverging_node(canonical_wan21):
    result = find_matches(canonical_wan21["steady"].graph_module, _pattern("causal_conv_input[mode=chunk0]"))
    assert not result.matches
    reason = result.near_misses()[0].reason
    assert "expected aten.zeros_like.default but found aten.unsqueeze.default" in reason
    assert "at node unsqueeze" in reason


def test_matches_carry_provenance_that_cross_checks(canonical_wan21):
    result = find_matches(canonical_wan21["steady"].graph_module, _pattern("rms_norm[act=silu, half=None]"))
    assert len(result.matches) == 21
    assert all(m.module_type.endswith("WanRMS_norm") or m.cross_check() for m in result.matches)
    assert any(m.module_path.startswith("decoder.mid_block.resnets.0") for m in result.matches)


def test_every_pattern_declares_exactness_level_and_doc():
    for pattern in registry():
        assert pattern.exactness in ("exact", "tolerance")
        assert pattern.level in ("lossless", "channels_last")
        assert "Matches:" in pattern.doc and "Exactness:" in pattern.doc, pattern.name
