"""The package layout's import directions (docs/design.md section 2): kernels < ops < model families < API;
engine < passes < API; patterns < passes; runtime beside passes; no family imports another; no import cycles.

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
PACKAGE_DIRS = {"rewrite": ROOT / "rewrite", "rewrite.patterns": ROOT / "patterns", "rewrite.passes": ROOT / "passes",
                "rewrite.tools": ROOT / "tools"}
#: the model families: the folders of rewrite/models
FAMILIES = tuple(sorted(d.name for d in (ROOT / "rewrite" / "models").iterdir() if (d / "__init__.py").is_file()))


def _built_on(family: str) -> tuple[str, ...]:
    """The families whose public pieces `family` uses, as its package declares (``BUILT_ON`` in its
    ``__init__.py``; Qwen-Image's VAE is Wan 2.1's blocks: Wan's capture and runner)."""
    tree = ast.parse((ROOT / "rewrite" / "models" / family / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "BUILT_ON" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


FAMILY_BASES = {family: _built_on(family) for family in FAMILIES}

# For each module of the package, which other packages its import brought in first (cumulative: a module
# imported later may find a package already loaded by an earlier one, so an empty union clears them all).
LOADED = r"""
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
forbidden = sys.argv[2].split(",")
brought = {}
for info in sorted(pkgutil.walk_packages(package.__path__, package.__name__ + "."), key=lambda info: info.name):
    before = set(sys.modules)
    importlib.import_module(info.name)
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


def test_importing_any_kernel_module_loads_no_api_pass_engine_runtime_or_model():
    forbidden = ("rewrite.api", "rewrite.pipeline", "rewrite.passes", "rewrite.patterns", "rewrite.engine",
                 "rewrite.runtime", "rewrite.capture", "rewrite.models")
    assert _brought_in("rewrite.kernels", forbidden) == {}


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


def _imported_modules(path: pathlib.Path, package: str, type_checking: bool = True) -> set[str]:
    """Every module an `import` or `from ... import` anywhere in the file names (relative ones resolved);
    without `type_checking`, not those under `if TYPE_CHECKING:` (type hints only: they never run)."""
    tree = ast.parse(path.read_text())
    branches = [] if type_checking else [
        branch for branch in ast.walk(tree) if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)]
    hidden = {id(node) for branch in branches for node in ast.walk(branch)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join(parts + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def _library_modules() -> dict[str, pathlib.Path]:
    """Every module of the installed package by its import name (passes/, patterns/, tools/ under `rewrite`)."""
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if package == "rewrite" and parts[0] in ("patterns", "passes", "tools"):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def _package_of(name: str, path: pathlib.Path) -> str:
    """The package a module's relative imports resolve against: itself for a package's `__init__`."""
    return name if path.name == "__init__.py" else name.rsplit(".", 1)[0]


def test_a_pattern_imports_no_other_patterns_module_but_the_shared_ones():
    patterns = {name for name in _library_modules() if name.startswith("rewrite.patterns.")}
    shared = {name for name in patterns if name.startswith("rewrite.patterns.common")}
    for name, path in _library_modules().items():
        if name in patterns and name not in shared and not path.name == "__init__.py":
            others = _imported_modules(path, _package_of(name, path)) & patterns - shared - {name}
            others = {m for m in others if m not in ("rewrite.patterns", *(f"rewrite.patterns.{f}" for f in FAMILIES))}
            assert not others, (name, others)


def test_a_model_family_imports_no_other_family():
    """A family's code (`rewrite/models/<family>/`, `patterns/<family>/`) names no other family's modules but
    those of the families it is built on (``BUILT_ON`` in its package)."""
    for name, path in _library_modules().items():
        parts = name.split(".")
        if len(parts) < 3 or parts[1] not in ("models", "patterns") or parts[2] not in FAMILIES:
            continue
        family = parts[2]
        imported = _imported_modules(path, _package_of(name, path), type_checking=False)
        foreign = {m for m in imported if m.split(".")[1:2] in (["models"], ["patterns"])
                   and len(m.split(".")) > 2 and m.split(".")[2] in FAMILIES and m.split(".")[2] != family
                   and m.split(".")[2] not in FAMILY_BASES.get(family, ())}
        assert not foreign, (name, foreign)


def test_the_library_imports_without_cycles():
    """Function-level imports count (a lazy import that closes a cycle is still a cycle); imports under `if
    TYPE_CHECKING:` do not (they never run)."""
    import networkx as nx

    modules = _library_modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for imported in _imported_modules(path, _package_of(name, path), type_checking=False):
            if imported in modules and imported != name and not name.startswith(imported + "."):
                graph.add_edge(name, imported)
    assert list(nx.simple_cycles(graph)) == []


def test_the_model_reads_the_alias_free_geometry_of_the_ops():
    from rewrite.models.auk import model
    from rewrite.kernels.alias_free import geometry
    from rewrite.models.auk.alias_free import alias_free_snake_reference

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
