"""What the `rewrite-debug` tests share (`test_debug.py`, `test_debug_arguments.py`): each model captured once a
session and served to the CLI as fresh copies (the autouse `cached_models`, imported by each test module),
two tiny test patterns that swap in for the registry (`test_patterns`), a capture that fails the test
(`no_capture`), and readers of the CLI's text and JSON output."""

from __future__ import annotations

import json
import re

import pytest
import torch

from rewrite import explain, supported
from rewrite import patterns as pattern_registry
from rewrite.capture.export import CapturedGraph
from rewrite.engine.pattern import Pattern, variants
from rewrite.tools import debug
from tests.captures import copy_graph

aten = torch.ops.aten
GRAPHS = ["chunk0", "steady"]
CAPTURE = debug.capture_graphs  # the real capture (the fixture below swaps in the cached one)
_CAPTURED: dict[tuple[str, str, torch.dtype, bool, bool], list[CapturedGraph]] = {}
_OUTPUTS: dict[tuple[str, ...], str] = {}  # argv -> stdout of a run with the real registry (`run_text`)
REAL_REGISTRY = pattern_registry.registry
SYMBOL = re.compile(r"\bs\d+\b")  # a torch size symbol (s77): never printed in the text


# --------------------------------------------------------------------------------------------- fixtures


def captured(model: str, config: str = "tiny", dtype: torch.dtype = torch.float32,
             aten_activations: bool = False, encoder: bool = False) -> list[CapturedGraph]:
    """Fresh copies of the model's graphs (its encoder's with `encoder`), captured once per session."""
    key = (model, config, dtype, aten_activations, encoder)
    if key not in _CAPTURED:
        _CAPTURED[key] = CAPTURE(supported.get(model), config, dtype, aten_activations=aten_activations,
                                 encoder=encoder)
    return [copy_graph(g) for g in _CAPTURED[key]]


@pytest.fixture(autouse=True)
def cached_models(monkeypatch):
    """The CLI's capture serves the session's cached capture of every model."""
    monkeypatch.setattr(debug, "capture_graphs", lambda model, config, dtype, aten_activations=False, encoder=False:
                        captured(model.name, config, dtype, aten_activations, encoder))


@pytest.fixture
def no_capture(monkeypatch):
    """A capture fails the test: what is checked here must be checked before it."""
    def capture(*args, **kwargs):
        raise AssertionError("captured before the arguments were checked")

    monkeypatch.setattr(debug, "capture_graphs", capture)


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


def run_text(capsys, *argv: str) -> str:
    """The stdout of a successful run. With the real registry and no files written, one run per ``argv`` a
    session: the output depends on nothing else (the captures are cached, each run rewrites fresh copies)."""
    shared = pattern_registry.registry is REAL_REGISTRY and not {"--dot", "--graphml"} & set(argv)
    if shared and argv in _OUTPUTS:
        return _OUTPUTS[argv]
    assert debug.main(list(argv)) == 0
    out = capsys.readouterr().out
    if shared:
        _OUTPUTS[argv] = out
    return out


def run_json(capsys, *argv: str) -> dict:
    return json.loads(run_text(capsys, *argv, "--json"))  # the whole of stdout is one JSON object


def table_rows(out: str) -> dict[str, list[str]]:
    """The rows of the text's table (between the rule under the header and the tensor ops line), by their
    first cell (the pattern or family: a name may hold single spaces, cells are two or more apart)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("tensor ops"))
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[start:end] if not line.startswith("(")]
    return {cells[0]: cells[1:] for cells in rows}


def applicable_names(report: dict) -> list[str]:
    """The patterns enabled at the report's level that it does not list as not applicable, in registry order."""
    return [p.name for p in explain.enabled_patterns(report["level"]) if p.name not in report["not_applicable"]]
