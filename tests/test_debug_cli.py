"""`rewrite-debug`: table and JSON output, filters, near misses, DOT and GraphML files, bad arguments.

`main([...])` runs in-process. Capturing is the slow part (~10 s per model), so each model is captured
once per session and every run gets a fresh copy of its graphs (the passes rewrite them in place).
Tests that need known matches swap the pattern registry for two tiny test patterns, so that they do not
depend on what the Wan pattern files hold; the others run with the real registry, whatever it holds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import subprocess

import networkx as nx
import pytest
import torch
import torch.fx as fx

from rewrite import patterns as pattern_registry
from rewrite.capture.export import CapturedGraph
from rewrite.engine.pattern import Pattern, variants
from rewrite.passes.canonicalize import canonicalize
from rewrite.passes.fuse_patterns import fuse_patterns
from rewrite.passes.manager import PassContext
from rewrite.tools import debug

aten = torch.ops.aten
GRAPHS = ["chunk0", "steady"]
CAPTURE = dict(debug.MODELS)  # the real adapters (the fixture below swaps debug.MODELS for cached ones)
_CAPTURED: dict[tuple[str, str, torch.dtype, bool], list[CapturedGraph]] = {}


# --------------------------------------------------------------------------------------------- fixtures


def copy_graph(graph: CapturedGraph) -> CapturedGraph:
    """A copy whose graph can be rewritten without touching ``graph`` (node meta is shared, read-only)."""
    module = fx.GraphModule(graph.graph_module, copy.deepcopy(graph.graph_module.graph))
    return dataclasses.replace(graph, graph_module=module, matches={}, passes=[])


def captured(model: str, config: str = "tiny", dtype: torch.dtype = torch.float32,
             aten_activations: bool = False) -> list[CapturedGraph]:
    """Fresh copies of the model's graphs, captured once per session."""
    key = (model, config, dtype, aten_activations)
    if key not in _CAPTURED:
        _CAPTURED[key] = CAPTURE[model](config, dtype, aten_activations=aten_activations)
    return [copy_graph(g) for g in _CAPTURED[key]]


@pytest.fixture(autouse=True)
def cached_models(monkeypatch):
    """Every model adapter of the CLI serves the session's cached capture."""
    adapters = {name: (lambda config, dtype, aten_activations=False, name=name:
                       captured(name, config, dtype, aten_activations)) for name in CAPTURE}
    monkeypatch.setattr(debug, "MODELS", adapters)


def silu_search(x):
    return aten.silu.default(x)


def silu_replace(x):
    return aten.silu.default(x)


def silu_mul_search(x, y):
    return aten.mul.Tensor(aten.silu.default(x), y)


def silu_mul_replace(x, y):
    return aten.mul.Tensor(aten.silu.default(x), y)


def tanh_search(x):
    return aten.tanh.default(x)


def tanh_replace(x):
    return aten.tanh.default(x)


TEST_PATTERNS: tuple[Pattern, ...] = (
    # a family of two: "test_silu" matches every silu of the decoder, "test_silu[silu_]" none (no in-place silu)
    *variants(silu_search, silu_replace, name="test_silu", exactness="exact", level="lossless", inplace=("silu",)),
    # a silu feeding a mul does not occur in the Wan decoder: zero matches, near misses at every silu
    Pattern(name="test_silu_mul", search=silu_mul_search, replace=silu_mul_replace, exactness="exact",
            level="lossless"),
    # enabled only at channels_last
    Pattern(name="test_tanh", search=tanh_search, replace=tanh_replace, exactness="tolerance",
            level="channels_last"),
)


@pytest.fixture
def test_patterns(monkeypatch):
    """The registry holds TEST_PATTERNS only (the CLI and fuse_patterns both read it at call time)."""
    monkeypatch.setattr(pattern_registry, "registry", lambda: TEST_PATTERNS)
    return TEST_PATTERNS


def run_json(capsys, *argv: str) -> dict:
    assert debug.main([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # the whole of stdout is one JSON object


def lossless_names() -> list[str]:
    return [p.name for p in debug.enabled_patterns("lossless")]


# --------------------------------------------------------------------------------------------- output


@pytest.mark.parametrize("model", ["wan2.1", "wan2.2"])
def test_table_lists_both_graphs_and_every_enabled_pattern(model, capsys):
    assert debug.main([model]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("pattern"))
    assert header.split()[1:] == GRAPHS
    for name in lossless_names():
        assert any(line.startswith(name + " ") for line in out.splitlines()), name


@pytest.mark.parametrize("model", ["wan2.1", "wan2.2"])
def test_json_has_both_graphs_with_counts_and_empty_near_misses(model, capsys):
    report = run_json(capsys, model)
    assert {k: report[k] for k in ("model", "config", "level", "dtype")} == {
        "model": model, "config": "tiny", "level": "lossless", "dtype": "float32"}
    assert [g["name"] for g in report["graphs"]] == GRAPHS
    for graph in report["graphs"]:
        assert list(graph["matches"]) == lossless_names()
        assert graph["near_misses"] == {}
        assert graph["nodes"] > 0
        assert len(graph["subgraphs"]) == sum(graph["matches"].values())


def test_json_records_matched_subgraphs(test_patterns, capsys):
    report = run_json(capsys, "wan2.1")
    for graph in report["graphs"]:
        assert graph["matches"]["test_silu"] > 0
        assert graph["matches"]["test_silu[silu_]"] == 0
        assert graph["matches"]["test_silu_mul"] == 0
        assert "test_tanh" not in graph["matches"]  # channels_last only
        subgraph = graph["subgraphs"][0]
        assert subgraph["pattern"] == "test_silu" and subgraph["graph"] == graph["name"]
        assert subgraph["module"].startswith("decoder.")
        assert subgraph["module_type"] == "torch.nn.modules.activation.SiLU"
        [node] = subgraph["nodes"]
        assert node["op"] == "aten.silu.default" and node["dtype"] == "float32"
        assert node["shape"].startswith("[") and node["inputs"]


def test_counts_are_those_of_fuse_patterns(test_patterns, capsys):
    report = run_json(capsys, "wan2.1")
    for graph, expected in zip(captured("wan2.1"), report["graphs"]):
        ctx = PassContext(level="lossless", dtype=graph.dtype, device=graph.device)
        gm = canonicalize(graph.graph_module, ctx).gm
        assert fuse_patterns(gm, ctx).stats["matches"] == expected["matches"]


def test_table_text_shows_subgraphs_with_module_and_nodes(test_patterns, capsys):
    assert debug.main(["wan2.1", "--graph", "steady"]) == 0
    out = capsys.readouterr().out
    assert "test_silu #1 in steady: decoder." in out
    assert "aten.silu.default" in out and "float32" in out
    assert " in chunk0" not in out


def test_level_decides_the_rows(test_patterns, capsys):
    report = run_json(capsys, "wan2.1", "--level", "channels_last", "--graph", "chunk0")
    assert list(report["graphs"][0]["matches"]) == [p.name for p in TEST_PATTERNS]


# --------------------------------------------------------------------------------------------- AuK

AUK_LOSSLESS = {"alias_free_activation[exact]": 109, "causal_conv1d": 54, "causal_conv1d[residual=None]": 54,
                "causal_conv1d[residual=None, bias=None]": 1, "causal_conv_transpose1d": 6, "amp_average": 6}


def test_auk_table_has_one_decode_graph_and_every_enabled_pattern(capsys):
    assert debug.main(["auk"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("auk (tiny, float32) at level lossless")
    header = next(line for line in out.splitlines() if line.startswith("pattern"))
    assert header.split()[1:] == ["decode"]
    table = [line.split() for line in out.splitlines() if len(line.split()) == 2]  # pattern, count
    rows = {name: count for name, count in table if name.startswith(("alias_free", "amp_"))}
    assert rows == {"alias_free_activation[exact]": "109", "amp_average": "6"}
    for name in lossless_names():
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
    assert "alias_free_activation[exact] #109 in decode: decoder.activation_post" in out


def test_auk_json_counts_and_subgraphs(capsys):
    report = run_json(capsys, "auk")
    assert {k: report[k] for k in ("model", "config", "level", "dtype")} == {
        "model": "auk", "config": "tiny", "level": "lossless", "dtype": "float32"}
    [graph] = report["graphs"]
    assert graph["name"] == "decode" and list(graph["matches"]) == lossless_names()
    assert {k: v for k, v in graph["matches"].items() if v} == AUK_LOSSLESS
    assert len(graph["subgraphs"]) == sum(AUK_LOSSLESS.values())
    first = next(s for s in graph["subgraphs"] if s["pattern"] == "alias_free_activation[exact]")
    assert first["module"] == "decoder.resblocks.0.activations.0" and first["cross_check"]
    assert first["module_type"].endswith("AliasFreeSnakeBeta") and first["scalars"] == {}
    assert [n["op"] for n in first["nodes"]] == ["rewrite.alias_free_snake_module.default"]


def test_auk_aten_activations_show_the_activations_aten_ops(capsys):
    report = run_json(capsys, "auk", "--aten-activations", "--pattern", "alias_free_activation")
    [graph] = report["graphs"]
    assert graph["matches"] == {"alias_free_activation[exact]": 0, "alias_free_activation[exact, aten]": 109}
    first = graph["subgraphs"][0]
    assert first["pattern"] == "alias_free_activation[exact, aten]" and first["scalars"] == {"channels": 64}
    assert [n["op"] for n in first["nodes"]][:2] == ["aten.pad.default", "aten.expand.default"]


def test_auk_full_config_at_channels_last(capsys):
    report = run_json(capsys, "auk", "--config", "full", "--level", "channels_last", "--pattern", "alias_free_activation")
    [graph] = report["graphs"]
    assert graph["matches"] == {"alias_free_activation[fused]": 109, "alias_free_activation[exact]": 0,
                                "alias_free_activation[fused, aten]": 0, "alias_free_activation[exact, aten]": 0}
    first = graph["subgraphs"][0]
    assert first["pattern"] == "alias_free_activation[fused]" and first["module"] == "decoder.resblocks.0.activations.0"


# --------------------------------------------------------------------------------------------- filters


def test_graph_filter(capsys):
    report = run_json(capsys, "wan2.2", "--graph", "steady")
    assert [g["name"] for g in report["graphs"]] == ["steady"]


def test_pattern_filter_by_family_and_exact_name(test_patterns, capsys):
    by_family = run_json(capsys, "wan2.1", "--pattern", "test_silu")
    assert list(by_family["graphs"][0]["matches"]) == ["test_silu", "test_silu[silu_]"]
    exact = run_json(capsys, "wan2.1", "--pattern", "test_silu[silu_]")
    assert list(exact["graphs"][0]["matches"]) == ["test_silu[silu_]"]
    assert exact["graphs"][0]["subgraphs"] == []


def test_near_misses_of_patterns_without_matches(test_patterns, capsys):
    report = run_json(capsys, "wan2.1", "--near-misses")
    for graph in report["graphs"]:
        assert set(graph["near_misses"]) == {"test_silu[silu_]", "test_silu_mul"}
        reasons = graph["near_misses"]["test_silu_mul"]
        assert reasons and all(r.startswith("test_silu_mul: matched 1/2 ops") for r in reasons)
        assert any("expected aten.mul.Tensor" in r for r in reasons)  # from a silu: its users hold no mul


def test_near_misses_of_a_named_pattern_even_when_it_matched(test_patterns, capsys):
    report = run_json(capsys, "wan2.1", "--pattern", "test_silu", "--near-misses", "--graph", "chunk0")
    assert set(report["graphs"][0]["near_misses"]) == {"test_silu", "test_silu[silu_]"}


def test_near_misses_in_the_text_report(test_patterns, capsys):
    assert debug.main(["wan2.1", "--near-misses", "--pattern", "test_silu_mul"]) == 0
    out = capsys.readouterr().out
    assert "near misses of test_silu_mul in chunk0:" in out
    assert "    - test_silu_mul: matched 1/2 ops; at node " in out


# --------------------------------------------------------------------------------------------- files


def test_dot_files(test_patterns, tmp_path, capsys):
    assert debug.main(["wan2.1", "--dot", str(tmp_path)]) == 0
    for name in GRAPHS:
        text = (tmp_path / f"{name}.dot").read_text()
        assert text.startswith(f'digraph "{name}" {{') and text.rstrip().endswith("}")
        assert 'fillcolor="lightblue"' in text  # the first pattern's color
    subgraph = (tmp_path / "chunk0.test_silu.1.dot").read_text()
    assert "aten.silu.default" in subgraph and 'style="dashed"' in subgraph  # the silu and its input


def test_dot_files_with_the_real_registry(tmp_path, capsys):
    assert debug.main(["wan2.2", "--dot", str(tmp_path / "dot")]) == 0
    assert {p.name for p in (tmp_path / "dot").glob("*.dot")} >= {"chunk0.dot", "steady.dot"}


def test_graphml_reads_back_with_pattern_attributes(test_patterns, tmp_path, capsys):
    path = tmp_path / "graphs.graphml"
    report = run_json(capsys, "wan2.1", "--graphml", str(path))
    graph = nx.read_graphml(path)
    assert {a["graph"] for _, a in graph.nodes(data=True)} == set(GRAPHS)
    for expected in report["graphs"]:
        matched = {node for node, a in graph.nodes(data=True)
                   if a["graph"] == expected["name"] and a.get("pattern") == "test_silu"}
        assert len(matched) == expected["matches"]["test_silu"]
        silu = next(iter(matched))
        assert graph.nodes[silu]["target"] == "aten.silu.default"
        assert graph.nodes[silu]["match"].startswith("test_silu #")
        assert any(graph.in_edges(silu))


# --------------------------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("argv, message", [
    (["sd3"], "invalid choice"),
    (["wan2.1", "--level", "fast"], "invalid choice"),
    (["wan2.1", "--dtype", "float64"], "invalid choice"),
    (["wan2.1", "--config", "huge"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_usage(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        debug.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: rewrite-debug" in err and message in err


def test_unknown_graph_lists_the_graphs(capsys):
    with pytest.raises(SystemExit) as exit_info:
        debug.main(["wan2.1", "--graph", "chunk1"])
    assert exit_info.value.code == 2
    assert "unknown graph 'chunk1'; this model's graphs: chunk0, steady" in capsys.readouterr().err


def test_unknown_pattern_lists_the_patterns(test_patterns, capsys):
    with pytest.raises(SystemExit) as exit_info:
        debug.main(["wan2.1", "--pattern", "rms"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown pattern 'rms'" in err and "test_silu, test_silu[silu_], test_silu_mul, test_tanh" in err


def test_pattern_of_a_higher_level_names_the_level(test_patterns, capsys):
    with pytest.raises(SystemExit) as exit_info:
        debug.main(["wan2.1", "--pattern", "test_tanh"])
    assert exit_info.value.code == 2
    assert "--level channels_last" in capsys.readouterr().err


def test_empty_registry(monkeypatch, capsys):
    monkeypatch.setattr(pattern_registry, "registry", lambda: ())
    report = run_json(capsys, "wan2.1", "--near-misses")
    assert all(g["matches"] == {} and g["subgraphs"] == [] for g in report["graphs"])
    assert debug.main(["wan2.1"]) == 0
    assert "(no patterns enabled at level 'lossless')" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        debug.main(["wan2.1", "--pattern", "rms_norm"])
    assert "no patterns are registered" in capsys.readouterr().err


def test_console_script_help():
    script = shutil.which("rewrite-debug")
    if script is None:
        pytest.skip("rewrite-debug is not installed as a console script")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "usage: rewrite-debug" in result.stdout
