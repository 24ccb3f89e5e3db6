"""Plan overlapping decode windows for a long clip.

A decoder whose output at frame ``f`` depends on ``left`` latent frames before
``f`` and ``right`` frames after it can decode a long clip piece by piece: each
window of ``tile`` latent frames is decoded on its own, and only the frames that
see their full context inside the window are kept ("emitted").  At the clip's
own edges the clip boundary is the true boundary, so no halo is needed there.

Planning (all numbers in latent frames, emit ranges half-open, clip coordinates):

* ``frames <= tile``: one window of the clip's own length emits everything.
* Otherwise every window is ``tile`` wide.  The first starts at 0 and emits
  from 0; each later window starts ``left`` frames before the first frame it
  emits.  A window emits up to ``right`` frames before its own end:
  ``emit_end = window_start + tile - right``.  Each step therefore advances by
  ``tile - left - right`` frames, which is why ``tile > left + right`` is required.
* A window is the last one when a ``tile``-wide window starting at
  ``next_emit - left`` would reach the clip end.  The last window is pinned to
  the clip end and emits to it.  Its width is the smallest entry of ``sizes``
  that holds the remaining frames plus the left halo
  (``size >= frames - emit_start + left``) and fits in the clip
  (``size <= frames``); ``tile`` itself is always a candidate, so a size larger
  than ``tile`` is never picked.  Pinned to the end, the last window may start
  earlier than ``emit_start - left``: more context, never less.

Example: ``frames=20, tile=10, left=2, right=1, sizes=(4, 8)``::

    clip   0         1         2
           01234567890123456789
    W0     [=======]-                  window [0, 10), emits [0, 9)
    W1            --[=====]-           window [7, 17), emits [9, 16)
    W2                 ----[==]        window [12, 20) (width 8), emits [16, 20)

    W0: starts at 0, emit_end = 0 + 10 - 1 = 9.
    W1: starts at 9 - 2 = 7; 7 + 10 = 17 < 20, not last; emit_end = 7 + 10 - 1 = 16.
    W2: 16 - 2 + 10 = 24 >= 20, last; needs 20 - 16 + 2 = 6 frames -> size 8
        (4 is too small), pinned to the end: starts at 20 - 8 = 12.

``-`` marks context frames decoded but not emitted, ``=`` (with its brackets)
the emitted frames.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

__all__ = ["Window", "plan_tiles"]


class Window(NamedTuple):
    """One decode window: covers ``[window_start, window_start + window_frames)``
    and emits ``[emit_start, emit_end)``, all in clip latent frames."""

    window_start: int
    window_frames: int
    emit_start: int
    emit_end: int


def _check_int(name: str, value: object) -> int:
    # bool is an int subclass; reject it, it is never meant as a frame count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    return value


def plan_tiles(
    frames: int,
    tile: int,
    left: int,
    right: int,
    sizes: Iterable[int] = (),
) -> list[Window]:
    """Split ``frames`` latent frames into overlapping windows of width ``tile``.

    ``left``/``right`` are the context frames a decoded frame needs before/after
    it inside its window; ``sizes`` are optional smaller widths the last window
    may shrink to.  Returns windows in order whose emit ranges cover
    ``[0, frames)`` exactly once.  See the module docstring for the rules.
    """
    frames = _check_int("frames", frames)
    tile = _check_int("tile", tile)
    left = _check_int("left", left)
    right = _check_int("right", right)
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    if left < 0:
        raise ValueError(f"left must be >= 0, got {left}")
    if right < 0:
        raise ValueError(f"right must be >= 0, got {right}")
    if tile <= left + right:
        raise ValueError(
            f"tile must exceed left+right so each window emits at least one frame: "
            f"tile={tile}, left={left}, right={right}, left+right={left + right}"
        )
    if isinstance(sizes, (str, bytes)):
        raise TypeError(f"sizes must be an iterable of ints, got {type(sizes).__name__}")
    size_list = [_check_int("sizes entry", s) for s in sizes]
    for s in size_list:
        if s < 1:
            raise ValueError(f"sizes entries must be positive, got {s} in {tuple(size_list)}")

    if frames <= tile:
        return [Window(0, frames, 0, frames)]

    windows: list[Window] = []
    emit = 0
    while True:
        start = 0 if emit == 0 else emit - left
        if start + tile >= frames:
            # Last window: emits [emit, frames), pinned to the clip end.
            need = frames - emit + left
            width = min([tile] + [s for s in size_list if need <= s <= frames])
            windows.append(Window(frames - width, width, emit, frames))
            return windows
        emit_end = start + tile - right
        windows.append(Window(start, tile, emit, emit_end))
        emit = emit_end
