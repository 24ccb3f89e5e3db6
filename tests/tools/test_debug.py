"""`rewrite-debug`: the default summary, the --details and JSON output, which patterns apply and why not, sizes by
name, combined matches, tensor op counts, AuK's graph (the fixtures and readers: `tests/tools/debug_cli.py`).
"""

from __future__ import annotations

import re

import pytest
import torch

from rewrite import explain, supported
from rewrite import patterns as pattern_registry
from rewrite.passes.canonicalize import canonicalize
from rewrite.passes.fuse_patterns import fuse_patterns
from rewrite.passes.manager import PassContext
from rewrite.pipeline import rewrite_graph
from rewrite.reporting import GraphReport as ReportRow
from rewrite.reporting import op_count
from rewrite.tools import debug
from tests import quick
from tests.tools.debug_cli import (  # noqa: F401  (cached_models: autouse in this module too)
    GRAPHS, SYMBOL, TEST_PATTERNS, applicable_names, cached_models, captured, run_json, run_text, table_rows, test_patterns)


# --------------------------------------------------------------------------------------------- output


@pytest.mark.parametrize("model", ["wan2.1", pytest.param("wan2.2", marks=quick.slow)])
def test_details_table_lists_both_graphs_and_every_applicable_pattern(model, capsys):
    report = run_json(capsys, model)
    out = run_text(capsys, model, "--details")
    header = next(line for line in out.splitlines() if line.startswith("pattern"))
    assert header.split()[1:] == GRAPHS
    for name in applicable_names(report):
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
    for name in report["not_applicable"]:
        assert not any(line.startswith(name + " ") for line in out.splitlines()), name
    assert f"{len(report['not_applicable'])} patterns do not apply here and are not shown" in out


def family_sums(report: dict, graph: dict) -> dict[str, tuple[str, str]]:
    """Family -> (matched, declined) of one JSON graph over the patterns the report shows."""
    family = {p.name: p.family for p in pattern_registry.registry()}
    sums: dict[str, list[int]] = {}
    for name in applicable_names(report):
        counts = sums.setdefault(family[name], [0, 0])
        counts[0] += graph["matches"][name]
        counts[1] += len(graph["declined"].get(name, ()))
    return {f: (str(m), str(d)) for f, (m, d) in sums.items()}


def test_default_is_a_summary_per_pattern_family_and_graph(capsys):
    """A row per family, per graph how many times it matched and how many candidates it declined: the sums
    of the JSON's per-pattern counts. No match listing, no per-pattern row, and a line saying how to see
    them; well under a hundred lines."""
    report = run_json(capsys, "wan2.1")
    out = run_text(capsys, "wan2.1")
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("pattern family"))
    assert lines[header].split()[2:] == GRAPHS
    assert lines[header + 1].split() == ["matched", "declined"] * len(GRAPHS)
    chunk0, steady = (family_sums(report, graph) for graph in report["graphs"])
    rows = table_rows(out)
    assert list(rows) == list(chunk0)  # the families, in registry order
    for family, cells in rows.items():
        assert cells == [*chunk0[family], *steady[family]], family
    assert rows["rms_norm"][0] == str(sum(report["graphs"][0]["matches"][n] for n in applicable_names(report)
                                          if n.startswith("rms_norm[")))
    assert not any("[" in name for name in rows)  # families, not variants
    assert " #1 in " not in out and "near misses" not in out and explain.DECLINED_NOTE not in out
    assert lines[-1] == explain.DETAILS_HINT
    assert len(lines) < 40


@pytest.mark.parametrize("model", ["wan2.1", "wan2.2"])
def test_json_has_both_graphs_with_counts_and_empty_near_misses(model, capsys):
    report = run_json(capsys, model)
    assert {k: report[k] for k in ("model", "config", "level", "dtype")} == {
        "model": model, "config": "tiny", "level": "lossless", "dtype": "float32"}
    assert [g["name"] for g in report["graphs"]] == GRAPHS
    for graph in report["graphs"]:
        assert list(graph["matches"]) == applicable_names(report)
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


def test_details_show_subgraphs_with_module_and_nodes(test_patterns, capsys):
    assert debug.main(["wan2.1", "--graph", "steady", "--details"]) == 0
    out = capsys.readouterr().out
    assert "test_silu #1 in steady: decoder." in out
    assert "aten.silu.default" in out and "float32" in out
    assert " in chunk0" not in out


def test_level_decides_the_rows(test_patterns, capsys):
    report = run_json(capsys, "wan2.1", "--level", "channels_last", "--graph", "chunk0")
    assert list(report["graphs"][0]["matches"]) == [p.name for p in TEST_PATTERNS]


# --------------------------------------------------------------------------------------------- applicability


def families_by_kind(report: dict) -> dict[str, set[str]]:
    """Reason kind -> the families with a pattern of that kind in the report's not_applicable."""
    family = {p.name: p.family for p in pattern_registry.registry()}
    kinds: dict[str, set[str]] = {}
    for name, reason in report["not_applicable"].items():
        kinds.setdefault(explain.reason_kind(reason), set()).add(family[name])
    return kinds


def test_patterns_that_do_not_apply_are_named_with_why(capsys):
    """Wan 2.1 in fp32 on the CPU: AuK's and Wan 2.2's patterns are another model's, the half-dtype variants
    another dtype's, the deferred conv biases CUDA's, the fused activations another level's."""
    report = run_json(capsys, "wan2.1")
    kinds = families_by_kind(report)
    assert {"alias_free_activation", "causal_conv1d", "amp_average", "dup_up_add",
            "upsample_conv2d_dup_up_add"} <= kinds["other model"]
    assert {"residual_bias", "norm_input_bias", "norm_input_bias_identity"} <= kinds["needs CUDA"]
    assert {"snake_causal_conv1d", "deferred_conv_bias"} <= kinds["other level"]
    dtype = {n for n, r in report["not_applicable"].items() if explain.reason_kind(r) == "dtype"}
    assert "rms_norm[act=silu, half=torch.bfloat16]" in dtype and "upsample_nearest2x[upcast=True]" in dtype
    assert "rms_norm[act=silu, half=None]" not in report["not_applicable"]
    reasons = report["not_applicable"]
    assert reasons["dup_up_add[chunk=steady]"].startswith("other model: matches WanResidualUpBlock modules")
    assert reasons["rms_norm[act=None, half=torch.float16]"] == "dtype: matches float16 graphs (this one is float32)"
    assert reasons["residual_bias"].startswith("needs CUDA: its guard rejects cpu graphs (the graph runs on cpu")
    assert reasons["snake_causal_conv1d"] == "needs --level channels_last"
    wan22 = run_json(capsys, "wan2.2")
    assert "dup_up_add[chunk=steady]" not in wan22["not_applicable"]
    assert wan22["graphs"][1]["matches"]["dup_up_add[chunk=steady]"] > 0


def test_all_patterns_lists_the_others_with_why(capsys):
    report = run_json(capsys, "wan2.1")
    lines = run_text(capsys, "wan2.1", "--all-patterns", "--details").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pattern"))
    end = next(i for i, line in enumerate(lines) if line.startswith("tensor ops"))
    header, lines = lines[start], lines[start + 2:end + 2]  # the rows, then the line after the table
    assert header.split()[1:] == [*GRAPHS, "does", "not", "apply"]
    for pattern in pattern_registry.registry():
        [row] = [line for line in lines if line.startswith(pattern.name + " ")]
        assert row.endswith(report["not_applicable"].get(pattern.name, row.split()[-1])), row
    [row] = [line for line in lines if line.startswith("snake_causal_conv1d ")]
    assert row.split()[1:3] == ["-", "-"]  # not run at lossless
    assert not any("do not apply here and are not shown" in line for line in lines)


def test_all_patterns_in_the_summary_gives_each_family_that_cannot_apply_its_reason(capsys):
    report = run_json(capsys, "wan2.1")
    out = run_text(capsys, "wan2.1", "--all-patterns")
    rows = table_rows(out)
    assert list(rows) == list(explain.families(pattern_registry.registry()))
    assert rows["snake_causal_conv1d"] == ["-", "-", "-", "-", "needs --level channels_last"]  # not run at lossless
    assert rows["residual_bias"][-1] == report["not_applicable"]["residual_bias"]
    assert int(rows["residual_bias"][1]) > 0 and explain.DECLINED_NOTE in out  # its guard declines on the CPU
    assert len(rows["rms_norm"]) == 4  # some of its variants apply: counts, no reason
    assert "do not apply here and are not shown" not in out


def test_dtype_variants_that_cannot_apply():
    by_name = {p.name: p for p in pattern_registry.registry()}
    bf16, plain = by_name["rms_norm[act=silu, half=torch.bfloat16]"], by_name["rms_norm[act=silu, half=None]"]
    upcast = by_name["upsample_nearest2x[upcast=True]"]
    assert explain.dtype_reason(bf16, torch.float32) == "dtype: matches bfloat16 graphs (this one is float32)"
    assert explain.dtype_reason(bf16, torch.float16) == "dtype: matches bfloat16 graphs (this one is float16)"
    assert explain.dtype_reason(bf16, torch.bfloat16) is None
    assert explain.dtype_reason(plain, torch.float32) is None and explain.dtype_reason(plain, torch.bfloat16) is None
    assert explain.dtype_reason(upcast, torch.float32).startswith("dtype: matches an upcast to float32")
    assert explain.dtype_reason(upcast, torch.float16) is None


def test_near_misses_leave_out_the_patterns_that_cannot_apply(capsys):
    """fp32 Wan 2.2: no section for a bf16/fp16 variant, a CUDA-only family or a pattern matched elsewhere."""
    report = run_json(capsys, "wan2.2", "--near-misses")
    matched = {n for g in report["graphs"] for n, count in g["matches"].items() if count}
    for graph in report["graphs"]:
        assert graph["near_misses"]
        assert not set(graph["near_misses"]) & (set(report["not_applicable"]) | matched)
        assert all(graph["matches"][name] == 0 for name in graph["near_misses"])


# --------------------------------------------------------------------------------------------- sizes, nodes, combined matches


def test_symbolic_sizes_are_named_by_what_they_are_and_never_printed_as_symbols(capsys):
    wan = run_json(capsys, "wan2.1")
    for graph in wan["graphs"]:
        assert set(graph["sizes"]) == {"batch", "height", "width"}
        assert graph["input"] == "[batch, 4, 1, height, width]"
        shapes = [n["shape"] for s in graph["subgraphs"] for n in s["nodes"]]
        assert shapes and not any(SYMBOL.search(shape) for shape in shapes)
        assert any("height + 2" in shape for shape in shapes)  # the padded causal conv input
    [auk] = run_json(capsys, "auk")["graphs"]
    assert set(auk["sizes"]) == {"batch", "frames"} and auk["input"] == "[batch, frames, 8]"
    summary, details = run_text(capsys, "wan2.1"), run_text(capsys, "wan2.1", "--details")
    for out in (summary, details):
        assert ("sizes: batch, height, width are symbolic (any value); chunk0 and steady take their input "
                "[batch, 4, 1, height, width]") in out.splitlines()
        assert not SYMBOL.search(out)
    assert "[batch, 16, 1, height, width]" in details
    auk_text = run_text(capsys, "auk", "--near-misses", "--details")
    assert "sizes: batch, frames are symbolic (any value); decode takes its input [batch, frames, 8]" in auk_text
    assert not SYMBOL.search(auk_text)


def test_details_show_how_the_nodes_of_a_match_connect(test_patterns, capsys):
    report = run_json(capsys, "wan2.1", "--graph", "steady")
    first = report["graphs"][0]["subgraphs"][0]
    [node] = first["nodes"]
    assert debug.main(["wan2.1", "--graph", "steady", "--details"]) == 0
    out = capsys.readouterr().out
    assert f"    inputs: x = {first['inputs']['x']}" in out
    [line] = [line for line in out.splitlines() if line.split()[:1] == [node["name"]]]
    assert line.endswith(f"<- {', '.join(node['inputs'])}")


def test_combined_matches_name_the_matches_they_combine(capsys):
    report = run_json(capsys, "wan2.1", "--graph", "steady")
    subgraphs = {f"{s['pattern']} #{s['number']}": s for s in report["graphs"][0]["subgraphs"]}
    combined = [s for s in subgraphs.values() if s["family"] == "causal_conv3d"]
    assert combined and all(s["combines"] for s in combined)
    for record in combined:
        for label in record["combines"]:
            assert subgraphs[label]["combined_into"] == f"{record['pattern']} #{record['number']}"
        assert "causal_conv_input" in {subgraphs[label]["family"] for label in record["combines"]}
    norm_conv = next(s for s in subgraphs.values() if s["family"] == "rms_norm_causal_conv3d")
    assert {subgraphs[label]["family"] for label in norm_conv["combines"]} == {"rms_norm", "causal_conv3d"}


def test_graph_dot_boxes_every_match_in_its_own_colour(tmp_path, capsys):
    report = run_json(capsys, "wan2.1", "--graph", "steady", "--dot", str(tmp_path))
    text = (tmp_path / "steady.dot").read_text()
    subgraphs = report["graphs"][0]["subgraphs"]
    matched = list(dict.fromkeys(s["pattern"] for s in subgraphs))
    fills = dict(re.findall(r'"legend_\d+" \[label="([^"]+)", style="filled", fillcolor="(#[0-9a-f]{6})"\]', text))
    assert list(fills) == matched and len(set(fills.values())) == len(fills)  # no colour shared
    for record in subgraphs:  # a box per match, combined ones included
        assert f'subgraph "cluster_{record["pattern"]} #{record["number"]}"' in text
    inner = next(s for s in subgraphs if s["family"] == "causal_conv_input")
    outer = inner["combined_into"]
    block = text[text.index(f'subgraph "cluster_{outer}"'):]
    assert block.index(f'subgraph "cluster_{inner["pattern"]} #{inner["number"]}"') < block.index("\n  }")  # nested
    node = inner["nodes"][0]["name"]
    [line] = [line for line in text.splitlines() if line.startswith(f'  "{node}" [label=')]
    assert f'\\n{inner["pattern"]} #{inner["number"]}"' in line and f'fillcolor="{fills[inner["pattern"]]}"' in line


def test_distinct_colors_never_repeat():
    colors = explain.distinct_colors(200)
    assert len(set(colors)) == 200 and all(re.fullmatch(r"#[0-9a-f]{6}", c) for c in colors)


def test_level_off_rewrites_nothing(capsys):
    report = run_json(capsys, "wan2.1", "--level", "off")
    for graph in report["graphs"]:
        assert graph["passes"] == [] and graph["nodes_after"] == graph["nodes"] and graph["matches"] == {}
        assert graph["ops_after"] == graph["ops"]
    out = run_text(capsys, "wan2.1", "--level", "off")
    assert "level off rewrites nothing" in out
    [row] = [line for line in out.splitlines() if line.startswith("tensor ops")]
    assert "->" not in row and "captured, not rewritten" in row
    assert ", ".join(f"{g['name']} {g['ops']}" for g in report["graphs"]) in row


def test_tensor_ops_are_what_report_counts_for_graphs_of_one_size_or_any(capsys):
    """The capture `optimize` makes for a first decode has one size (no shape arithmetic), the tool's has
    symbolic sizes (more nodes); rewritten, both count the tensor ops the text says for each graph."""
    from rewrite.models.wan.capture import capture_wan_decoder

    report = run_json(capsys, "wan2.1")
    out = run_text(capsys, "wan2.1")
    decoder = supported.get("wan2.1").build("tiny", device=torch.device("cpu"), dtype=torch.float32).decoder
    one_size = capture_wan_decoder(decoder, torch.float32, torch.device("cpu"), (1, 4, 4))  # ~1/3 of a capture
    for symbolic, sized, expected in zip(captured("wan2.1"), one_size, report["graphs"]):
        assert symbolic.node_count > sized.node_count  # shape arithmetic, and slices not known to be whole
        assert op_count(symbolic.graph_module.graph) == expected["ops"]
        for graph in (symbolic, sized):
            rewrite_graph(graph, "lossless")  # as optimize does; its report row counts the same
            assert ReportRow.of(graph).ops == expected["ops_after"] < expected["ops"]
    [row] = [line for line in out.splitlines() if line.startswith("tensor ops, captured -> rewritten:")]
    assert ", ".join(f"{g['name']} {g['ops']} -> {g['ops_after']}" for g in report["graphs"]) in row


# --------------------------------------------------------------------------------------------- AuK

AUK_LOSSLESS = {"alias_free_activation[exact]": 109, "causal_conv1d": 54, "causal_conv1d[residual=None]": 54,
                "causal_conv1d[residual=None, bias=None]": 1, "causal_conv_transpose1d": 6, "amp_average": 6}


def test_auk_table_has_one_decode_graph_and_every_applicable_pattern(capsys):
    report = run_json(capsys, "auk")
    out = run_text(capsys, "auk", "--details")
    assert out.startswith("auk (tiny, float32) at level lossless")
    header = next(line for line in out.splitlines() if line.startswith("pattern"))
    assert header.split()[1:] == ["decode"]
    rows = {name: cells for name, cells in table_rows(out).items() if name.startswith(("alias_free", "amp_"))}
    assert rows == {"alias_free_activation[exact]": ["109"], "alias_free_activation[exact, aten]": ["0"],
                    "amp_average": ["6"]}
    for name in applicable_names(report):
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
    assert "alias_free_activation[exact] #109 in decode: decoder.activation_post" in out
    summary = table_rows(run_text(capsys, "auk"))
    assert summary["alias_free_activation"] == ["109", "0"] and summary["amp_average"] == ["6", "0"]
    assert summary["causal_conv1d"] == ["109", "0"]  # 54 + 54 + 1


def test_auk_json_counts_and_subgraphs(capsys):
    report = run_json(capsys, "auk")
    assert {k: report[k] for k in ("model", "config", "level", "dtype")} == {
        "model": "auk", "config": "tiny", "level": "lossless", "dtype": "float32"}
    [graph] = report["graphs"]
    assert graph["name"] == "decode" and list(graph["matches"]) == applicable_names(report)
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


# --------------------------------------------------------------------------------------------- the encoder


@pytest.mark.parametrize("model", ["wan2.1", pytest.param("qwenimage", marks=quick.slow)])
def test_encoder_shows_the_encoders_step_graphs_and_what_matched_there(model, capsys):
    report = run_json(capsys, model, "--encoder")
    assert report["model"] == f"{model} encoder"
    assert [g["name"] for g in report["graphs"]] == ["encode_chunk0", "encode_steady"]
    for graph in report["graphs"]:
        norm_convs = sum(n for name, n in graph["matches"].items() if name.split("[", 1)[0] == "rms_norm_causal_conv3d")
        assert norm_convs == 13 and graph["input"].startswith("[batch, 3, ")
