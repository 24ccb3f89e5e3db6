"""`rewrite-debug`'s filters (graphs, patterns, near misses), its DOT and GraphML files, bad arguments checked
before the capture, and a reader that closes stdout early (the fixtures and readers: `tests/tools/debug_cli.py`).
"""

from __future__ import annotations

import io
import shutil
import subprocess

import networkx as nx
import pytest

from rewrite import explain, supported
from rewrite import patterns as pattern_registry
from rewrite.tools import debug
from rewrite.tools.cli_output import BROKEN_PIPE_STATUS
from tests.tools.debug_cli import (  # noqa: F401  (cached_models: autouse in this module too)
    GRAPHS, cached_models, captured, no_capture, run_json, run_text, test_patterns)



def test_encoder_of_a_model_without_one_is_refused_before_the_capture(no_capture, capsys):
    with pytest.raises(SystemExit) as exited:
        debug.main(["auk", "--encoder"])
    assert exited.value.code == 2 and "auk has no encoder capture (models with one: wan2.1, wan2.2, qwenimage)" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        debug.main(["wan2.1", "--encoder", "--graph", "steady"])  # the encoder's graphs have other names
    assert "encode_steady" in capsys.readouterr().err

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


def test_near_misses_in_the_details(test_patterns, capsys):
    assert debug.main(["wan2.1", "--near-misses", "--pattern", "test_silu_mul", "--details"]) == 0
    out = capsys.readouterr().out
    assert "near misses of test_silu_mul in chunk0:" in out
    assert "    - test_silu_mul: matched 1/2 ops; at node " in out


def test_near_misses_in_the_summary_are_counted_by_kind(capsys):
    """AuK's aten-form activation pattern: one line per kind with its count, most common first, without
    node names (the kinds of the JSON); its 184 near misses are not listed one by one."""
    report = run_json(capsys, "auk", "--near-misses")
    out = run_text(capsys, "auk", "--near-misses")
    [graph] = report["graphs"]
    kinds = graph["near_miss_kinds"]["alias_free_activation[exact, aten]"]
    assert sum(kinds.values()) == len(graph["near_misses"]["alias_free_activation[exact, aten]"])
    assert list(kinds.values()) == sorted(kinds.values(), reverse=True)
    first, count = next(iter(kinds.items()))
    assert first == "expected aten.expand.default but found placeholder"
    lines = out.splitlines()
    start = lines.index(f"near misses of alias_free_activation[exact, aten] in decode: {sum(kinds.values())}")
    assert lines[start + 1] == f"    {count} x {first}"
    assert not any(line.startswith("    - ") for line in lines) and "p_decoder" not in out
    assert len(lines) < 40


# --------------------------------------------------------------------------------------------- files


def test_dot_files(test_patterns, tmp_path, capsys):
    assert debug.main(["wan2.1", "--dot", str(tmp_path)]) == 0
    for name in GRAPHS:
        text = (tmp_path / f"{name}.dot").read_text()
        assert text.startswith(f'digraph "{name}" {{') and text.rstrip().endswith("}")
        assert f'fillcolor="{explain.distinct_colors(1)[0]}"' in text  # the first pattern's colour
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


def test_unknown_graph_lists_the_graphs(no_capture, capsys):
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


@pytest.mark.parametrize("make_argv, message", [
    (lambda tmp: ["wan2.1", "--dot", str(tmp / "a_file")], "is a file; give a directory"),
    (lambda tmp: ["wan2.1", "--graphml", str(tmp)], "is a directory; give a file name"),
    (lambda tmp: ["wan2.1", "--graphml", str(tmp / "a_file" / "g.graphml")], "is a file, not a directory"),
    (lambda tmp: ["wan2.2", "--aten-activations"], "--aten-activations is for models with alias-free activations"),
    (lambda tmp: ["auk", "--graph", "steady"], "unknown graph 'steady'; this model's graphs: decode"),
])
def test_arguments_are_checked_before_the_capture(make_argv, message, tmp_path, no_capture, capsys):
    (tmp_path / "a_file").write_text("not a directory")
    with pytest.raises(SystemExit) as exit_info:
        debug.main(make_argv(tmp_path))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: rewrite-debug" in err and message in err and "Traceback" not in err


def test_graph_names_of_the_model_table_are_the_captured_ones():
    for name in supported.names():
        assert [g.name for g in captured(name)] == list(supported.get(name).graph_names)


def test_pattern_of_a_higher_level_names_the_level(test_patterns, capsys):
    with pytest.raises(SystemExit) as exit_info:
        debug.main(["wan2.1", "--pattern", "test_tanh"])
    assert exit_info.value.code == 2
    assert "--level channels_last" in capsys.readouterr().err


def test_empty_registry(monkeypatch, capsys):
    monkeypatch.setattr(pattern_registry, "registry", lambda: ())
    report = run_json(capsys, "wan2.1", "--near-misses")
    assert all(g["matches"] == {} and g["subgraphs"] == [] for g in report["graphs"])
    assert "(no patterns enabled at level 'lossless')" in run_text(capsys, "wan2.1")
    assert "(no patterns enabled at level 'lossless')" in run_text(capsys, "wan2.1", "--details")
    with pytest.raises(SystemExit):
        debug.main(["wan2.1", "--pattern", "rms_norm"])
    assert "no patterns are registered" in capsys.readouterr().err


def test_console_script_help():
    script = shutil.which("rewrite-debug")
    if script is None:
        pytest.skip("rewrite-debug is not installed as a console script")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "usage: rewrite-debug" in result.stdout


# --------------------------------------------------------------------------------------------- stdout closed


class ClosedStdout(io.StringIO):
    """A stdout whose reader has gone: every write raises BrokenPipeError, as a pipe into ``head`` does."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_reader_that_closes_stdout_ends_the_run_quietly(monkeypatch, capsys):
    """``rewrite-debug wan2.1 --json | head``: no traceback, exit status 141 (as for SIGPIPE)."""
    run_json(capsys, "wan2.1", "--graph", "steady")  # the capture, cached before stdout closes
    monkeypatch.setattr("sys.stdout", ClosedStdout())
    assert debug.main(["wan2.1", "--graph", "steady", "--json"]) == BROKEN_PIPE_STATUS
    assert "Traceback" not in capsys.readouterr().err
