"""Fusion patterns, one folder per model family (installed as ``rewrite.patterns``).

Each family folder (`wan/`, `auk/`, ...; `common/` holds the guard helpers they share) lists in its
``PATTERN_MODULES`` the modules whose ``PATTERNS`` it contributes, in matching order: a tuple of
``rewrite.engine.pattern.Pattern`` (usually from ``variants(...)``), with its replacement, guard, exactness
class and minimum level in the module docstring. ``registry()`` collects every family's, families in name
order (a family's patterns match only its own graphs, so the order between families is free); pattern names
must be unique. A new family is a new folder: nothing here names one.
"""

from __future__ import annotations

import importlib
import pkgutil

from rewrite.engine.pattern import Pattern

#: folders of this package that hold no patterns of their own
SHARED_FOLDERS = ("common",)


def families() -> tuple[str, ...]:
    """The family folders, in name order."""
    return tuple(sorted(info.name for info in pkgutil.iter_modules(__path__)
                        if info.ispkg and info.name not in SHARED_FOLDERS))


def registry() -> tuple[Pattern, ...]:
    """Every registered pattern: each family's, in its ``PATTERN_MODULES`` order."""
    patterns: list[Pattern] = []
    for family in families():
        package = importlib.import_module(f"{__name__}.{family}")
        for module_name in package.PATTERN_MODULES:
            patterns.extend(importlib.import_module(f"{package.__name__}.{module_name}").PATTERNS)
    names = [p.name for p in patterns]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate pattern names in the registry: {duplicates}")
    return tuple(patterns)
