"""Tests for rewrite.runtime.tiles.plan_tiles (pure Python, fast)."""

from __future__ import annotations

import random

import pytest

from rewrite.runtime.tiles import Window, plan_tiles


def check_invariants(windows, frames, tile, left, right, sizes=()):
    """Assert every documented property of a plan; return it for chaining."""
    assert windows, "plan must not be empty"
    assert all(isinstance(w, Window) for w in windows)

    # Single window: the whole clip, its own length.
    if frames <= tile:
        assert windows == [Window(0, frames, 0, frames)]
        return windows

    # Coverage exactly once, in order, contiguous.
    assert windows[0].emit_start == 0
    assert windows[-1].emit_end == frames
    for a, b in zip(windows, windows[1:]):
        assert a.emit_end == b.emit_start
    for w in windows:
        assert w.emit_start < w.emit_end  # every window emits something
    emitted = [f for w in windows for f in range(w.emit_start, w.emit_end)]
    assert emitted == list(range(frames))

    for i, w in enumerate(windows):
        end = w.window_start + w.window_frames
        last = i == len(windows) - 1
        # Window inside the clip and containing what it emits.
        assert 0 <= w.window_start <= w.emit_start
        assert w.emit_end <= end <= frames
        # Widths: tile everywhere; the last may come from sizes.
        if last:
            assert end == frames, "last window is pinned to the clip end"
            assert w.window_frames == tile or w.window_frames in sizes
            assert w.window_frames <= tile
        else:
            assert w.window_frames == tile
        # Left halo: the first emitted frame has >= left frames before it in
        # the window, unless the window starts at the clip start.
        if w.window_start != 0:
            assert w.emit_start - w.window_start >= left
        # Right halo: the last emitted frame has >= right frames after it in
        # the window, unless the window ends at the clip end.
        if end != frames:
            assert end - w.emit_end >= right
        # Window starts are strictly increasing.
        if i:
            assert w.window_start > windows[i - 1].window_start

    # Only the last window reaches the clip end.
    assert all(w.window_start + w.window_frames < frames for w in windows[:-1])
    return windows


def expected_last_width(frames, tile, left, sizes, emit_start):
    need = frames - emit_start + left
    fit = [s for s in sizes if need <= s <= min(tile, frames)]
    return min(fit) if fit else tile


@pytest.mark.parametrize("seed", range(4))
def test_random_invariants(seed):
    rng = random.Random(seed)
    for _ in range(150):
        left = rng.randint(0, 60)
        right = rng.randint(0, 20)
        tile = left + right + rng.randint(1, 200)
        frames = rng.randint(1, 5 * tile)
        sizes = tuple(rng.randint(1, tile + 50) for _ in range(rng.randint(0, 4)))
        windows = plan_tiles(frames, tile, left, right, sizes)
        check_invariants(windows, frames, tile, left, right, sizes)
        if frames > tile:
            last = windows[-1]
            assert last.window_frames == expected_last_width(frames, tile, left, sizes, last.emit_start)
            # Non-first, non-last windows start exactly `left` before their
            # emit start and emit up to exactly `right` before their end.
            for w in windows[1:-1]:
                assert w.emit_start - w.window_start == left
            for w in windows[:-1]:
                assert w.window_start + w.window_frames - w.emit_end == right
            # The last window was chosen by the reach rule; the one before it was not.
            assert last.emit_start - left + tile >= frames
            if len(windows) > 1:
                prev = windows[-2]
                prev_start = prev.window_start
                assert prev_start + tile < frames


def test_tight_tiles():
    # tile = left + right + 1: each middle window emits exactly one frame.
    for frames in range(1, 40):
        for left in range(0, 4):
            for right in range(0, 4):
                tile = left + right + 1
                windows = plan_tiles(frames, tile, left, right, (1, 2, 3))
                check_invariants(windows, frames, tile, left, right, (1, 2, 3))


def test_sizes_do_not_change_emit_ranges():
    rng = random.Random(1234)
    for _ in range(200):
        left, right = rng.randint(0, 30), rng.randint(0, 30)
        tile = left + right + rng.randint(1, 100)
        frames = rng.randint(1, 4 * tile)
        sizes = tuple(rng.randint(1, tile) for _ in range(3))
        a = plan_tiles(frames, tile, left, right)
        b = plan_tiles(frames, tile, left, right, sizes)
        assert [(w.emit_start, w.emit_end) for w in a] == [(w.emit_start, w.emit_end) for w in b]
        assert a[:-1] == b[:-1]


# ---------------------------------------------------------------- worked examples
# Parameters of the audio decoder case: tile=640, left=53, right=9, sizes=(160, 320, 640).
T, L, R, S = 640, 53, 9, (160, 320, 640)


def test_short_clip_single_window():
    # frames=100 <= tile=640: one window of the clip's own length.
    assert plan_tiles(100, T, L, R, S) == [Window(0, 100, 0, 100)]
    # frames == tile is still a single window.
    assert plan_tiles(640, T, L, R, S) == [Window(0, 640, 0, 640)]
    assert plan_tiles(1, T, L, R) == [Window(0, 1, 0, 1)]


def test_just_past_one_tile():
    # frames = 641 > 640.
    # W0: start 0; 0 + 640 = 640 < 641, not last; emit_end = 0 + 640 - 9 = 631.
    # W1: next emit 631, start 631 - 53 = 578; 578 + 640 = 1218 >= 641, last.
    #     remaining = 641 - 631 = 10, needs 10 + 53 = 63 -> smallest size >= 63 is 160,
    #     pinned to the end: start 641 - 160 = 481.
    assert plan_tiles(641, T, L, R, S) == [
        Window(0, 640, 0, 631),
        Window(481, 160, 631, 641),
    ]
    # Without sizes the last window is tile wide: start 641 - 640 = 1.
    assert plan_tiles(641, T, L, R) == [
        Window(0, 640, 0, 631),
        Window(1, 640, 631, 641),
    ]


def test_long_clip_1000():
    # frames = 1000.
    # W0: start 0; 640 < 1000, not last; emit [0, 631).
    # W1: start 631 - 53 = 578; 578 + 640 = 1218 >= 1000, last.
    #     remaining = 1000 - 631 = 369, needs 369 + 53 = 422: 160 and 320 too small,
    #     640 fits -> width 640, start 1000 - 640 = 360 (<= 578: extra context).
    expected = [Window(0, 640, 0, 631), Window(360, 640, 631, 1000)]
    assert plan_tiles(1000, T, L, R, S) == expected
    # Without sizes: same plan (tile is what sizes picked anyway).
    assert plan_tiles(1000, T, L, R) == expected


def test_long_clip_700_shrinks_last():
    # frames = 700.
    # W0: emit [0, 631).  W1: start 578, 578 + 640 = 1218 >= 700, last.
    #     remaining = 700 - 631 = 69, needs 69 + 53 = 122 -> 160, start 700 - 160 = 540.
    assert plan_tiles(700, T, L, R, S) == [Window(0, 640, 0, 631), Window(540, 160, 631, 700)]
    # Without sizes: width 640, start 700 - 640 = 60.
    assert plan_tiles(700, T, L, R) == [Window(0, 640, 0, 631), Window(60, 640, 631, 700)]


def test_long_clip_2000():
    # frames = 2000; each middle step advances 640 - 53 - 9 = 578 frames.
    # W0: start 0, 640 < 2000, emit [0, 631).
    # W1: start 631 - 53 = 578, 578 + 640 = 1218 < 2000, emit_end = 1218 - 9 = 1209.
    # W2: start 1209 - 53 = 1156, 1156 + 640 = 1796 < 2000, emit_end = 1796 - 9 = 1787.
    # W3: start 1787 - 53 = 1734, 1734 + 640 = 2374 >= 2000, last.
    #     remaining = 2000 - 1787 = 213, needs 213 + 53 = 266 -> 320, start 2000 - 320 = 1680.
    head = [Window(0, 640, 0, 631), Window(578, 640, 631, 1209), Window(1156, 640, 1209, 1787)]
    assert plan_tiles(2000, T, L, R, S) == head + [Window(1680, 320, 1787, 2000)]
    # Without sizes: width 640, start 2000 - 640 = 1360.
    assert plan_tiles(2000, T, L, R) == head + [Window(1360, 640, 1787, 2000)]


def test_docstring_example():
    # frames=20, tile=10, left=2, right=1, sizes=(4, 8):
    # W0 emit [0, 9); W1 start 7, emit [9, 16); W2 needs 20 - 16 + 2 = 6 -> 8, start 12.
    assert plan_tiles(20, 10, 2, 1, (4, 8)) == [
        Window(0, 10, 0, 9),
        Window(7, 10, 9, 16),
        Window(12, 8, 16, 20),
    ]


def test_sizes_order_and_oversize_ignored():
    # Unsorted sizes: smallest fitting is chosen.  A size > tile is never chosen
    # (tile is always a candidate), and a size > frames is never chosen.
    assert plan_tiles(700, T, L, R, (640, 320, 160)) == plan_tiles(700, T, L, R, S)
    assert plan_tiles(700, T, L, R, (2000,)) == plan_tiles(700, T, L, R)


# ---------------------------------------------------------------- errors
def test_tile_must_exceed_halos():
    with pytest.raises(ValueError, match=r"tile must exceed left\+right.*tile=62.*left=53.*right=9"):
        plan_tiles(1000, 62, 53, 9)
    with pytest.raises(ValueError, match="tile must exceed"):
        plan_tiles(1000, 10, 10, 0)
    # Even for a short clip the configuration is rejected.
    with pytest.raises(ValueError, match="tile must exceed"):
        plan_tiles(5, 10, 5, 5)
    # tile = left + right + 1 is the smallest allowed.
    assert plan_tiles(5, 63, 53, 9) == [Window(0, 5, 0, 5)]


@pytest.mark.parametrize(
    "args, exc, match",
    [
        ((0, 640, 53, 9), ValueError, "frames must be >= 1"),
        ((-5, 640, 53, 9), ValueError, "frames must be >= 1"),
        ((100, 0, 0, 0), ValueError, "tile must be >= 1"),
        ((100, 640, -1, 9), ValueError, "left must be >= 0"),
        ((100, 640, 53, -1), ValueError, "right must be >= 0"),
        ((100.0, 640, 53, 9), TypeError, "frames must be an int"),
        ((100, "640", 53, 9), TypeError, "tile must be an int"),
        ((100, 640, True, 9), TypeError, "left must be an int"),
        ((100, 640, 53, None), TypeError, "right must be an int"),
        ((100, 640, 53, 9, (160, 0)), ValueError, "sizes entries must be positive"),
        ((100, 640, 53, 9, (160, -3)), ValueError, "sizes entries must be positive"),
        ((100, 640, 53, 9, (160.0,)), TypeError, "sizes entry must be an int"),
        ((100, 640, 53, 9, "160"), TypeError, "sizes must be an iterable of ints"),
    ],
)
def test_bad_arguments(args, exc, match):
    with pytest.raises(exc, match=match):
        plan_tiles(*args)
