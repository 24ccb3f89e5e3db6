"""The package layout's import directions: ops < engine, patterns < passes < API; runtime beside passes.

Behavioural (what importing a layer loads, in a fresh interpreter: the test session has loaded everything)
and structural (which modules name which in their imports, read from the source, function-level imports
included).
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"rewrite.patterns": ROOT / "patterns", "rewrite.passes": ROOT / "passes"}

# For each module of the package, which other packages its import brought in first (cumulative: a module
# imported later may find a package already loaded by an earlier one, so an empty union clears them all).
LOADED = r"""
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
forbidden = sys.argv[2].split(",")
brought = {}
for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
    before = set(sys.modules)
    importlib.import_module(f"{package.__name__}.{info.name}")
    new = sorted(m for m in set(sys.modules) - before if any(m == f or m.startswith(f + ".") for f in forbidden))
    if new:
        brought[info.name] = new
print(json.dumps(brought))
"""


def _brought_in(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    result = subprocess.run([sys.executable, "-c", LOADED, package, ",".join(forbidden)], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_any_op_module_loads_no_api_pass_engine_runtime_or_model():
    forbidden = ("rewrite.api", "rewrite.pipeline", "rewrite.passes", "rewrite.patterns", "rewrite.engine",
                 "rewrite.runtime", "rewrite.capture", "rewrite.models")
    assert _brought_in("rewrite.ops", forbidden) == {}


def test_importing_the_passes_loads_no_runtime_capture_or_api():
    forbidden = ("rewrite.api", "rewrite.pipeline", "rewrite.runtime", "rewrite.capture")
    assert _brought_in("rewrite.passes", forbidden) == {}


def test_importing_the_engine_loads_no_pass_pattern_runtime_or_api():
    forbidden = ("rewrite.api", "rewrite.pipeline", "rewrite.passes", "rewrite.patterns", "rewrite.runtime")
    assert _brought_in("rewrite.engine", forbidden) == {}


def _imported_modules(path: pathlib.Path, package: str) -> set[str]:
    """Every module an `import` or `from ... import` anywhere in the file names (relative ones resolved)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def test_a_pattern_imports_no_other_patterns_module_but_the_shared_guards():
    patterns = {p.stem for p in PACKAGE_DIRS["rewrite.patterns"].glob("*.py")} - {"__init__"}
    for name in patterns:
        imported = _imported_modules(PACKAGE_DIRS["rewrite.patterns"] / f"{name}.py", "rewrite.patterns")
        others = {m.split(".")[2] for m in imported if m.startswith("rewrite.patterns.")} & patterns - {"_guards"}
        assert not others, (name, others)


def test_the_model_reads_the_alias_free_geometry_of_the_ops():
    from rewrite.models import auk as model
    from rewrite.ops import alias_free_geometry as geometry
    from rewrite.ops.alias_free import alias_free_snake_reference

    for name in ("FILTER_TAPS", "RESAMPLE_RATIO", "UP_PAD", "UP_CROP", "DOWN_PAD"):
        assert getattr(model, name) == getattr(geometry, name), name
    module = model.AliasFreeSnakeBeta(3)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        module.act.alpha.normal_(0, 0.5, generator=generator)
        module.act.beta.normal_(0, 0.5, generator=generator)
        for length in (1, 2, 7, 40):
            x = torch.randn(2, 3, length, generator=generator)
            assert module.upsample(x).shape[-1] == geometry.RESAMPLE_RATIO * length
            y = module(x)
            assert y.shape == x.shape
            assert torch.equal(y, alias_free_snake_reference(x, module.act.alpha, module.act.beta, module.taps))


def test_the_ops_modules_import_each_other_without_cycles():
    """Function-level imports count: a lazy import that closes a cycle is still a cycle."""
    import networkx as nx

    ops_dir = ROOT / "rewrite" / "ops"
    modules = {p.stem for p in ops_dir.glob("*.py")} - {"__init__"}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name in modules:
        for imported in _imported_modules(ops_dir / f"{name}.py", "rewrite.ops"):
            parts = imported.split(".")
            if parts[:2] == ["rewrite", "ops"] and len(parts) > 2 and parts[2] in modules and parts[2] != name:
                graph.add_edge(name, parts[2])
    assert list(nx.simple_cycles(graph)) == []
