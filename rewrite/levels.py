"""Optimization levels, ordered: each level enables everything the previous one does."""

from __future__ import annotations

LEVELS = ("off", "lossless", "channels_last")


def check_level(level: str) -> str:
    """Return `level` if it is known, else raise a ValueError listing the levels."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; expected one of {', '.join(LEVELS)}")
    return level


def level_enables(level: str, minimum: str) -> bool:
    """Whether running at `level` enables something whose lowest level is `minimum`."""
    return LEVELS.index(check_level(level)) >= LEVELS.index(check_level(minimum))
