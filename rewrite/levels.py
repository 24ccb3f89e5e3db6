"""Optimization levels, ordered: each level enables everything of the previous one.

``off``            nothing changes: the module as it came.
``lossless``       exact rewrites only: ``torch.equal`` with ``off`` (docs/design.md section 4).
``channels_last``  lossless plus layout changes and rewrites with a documented tolerance.

A pattern or pass declares the lowest level that enables it; ``level_enables(level, minimum)`` is the one
place that compares levels.
"""

from __future__ import annotations

LEVELS: tuple[str, ...] = ("off", "lossless", "channels_last")


def check_level(level: object) -> str:
    """Return ``level`` if it names a level, else raise ``ValueError`` listing the levels."""
    if not isinstance(level, str) or level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; expected one of: {', '.join(LEVELS)}")
    return level


def level_enables(level: str, minimum: str) -> bool:
    """Whether running at ``level`` enables something whose lowest enabling level is ``minimum``."""
    return LEVELS.index(check_level(level)) >= LEVELS.index(check_level(minimum))
