"""`warmup`'s size and frame-count arguments, checked: a clear error naming what is expected for anything else."""

from __future__ import annotations


def latent_sizes(shapes, expected: str = "shapes must be a list of (latent_height, latent_width) pairs of "
                                          "positive ints, e.g. [(60, 104)]") -> list[tuple[int, int]]:
    """`warmup`'s `shapes` as (height, width) pairs of positive ints; a clear error (`expected`) for anything else."""
    if shapes is None:
        return []
    if isinstance(shapes, (str, bytes)) or not isinstance(shapes, (list, tuple)):
        raise TypeError(f"warmup: {expected}; got {shapes!r}")
    if len(shapes) == 2 and all(isinstance(v, int) for v in shapes):
        raise TypeError(f"warmup: {expected}; got the flat pair {tuple(shapes)!r} (did you mean [{tuple(shapes)!r}]?)")
    pairs = []
    for pair in shapes:
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair)):
            raise ValueError(f"warmup: {expected}; got the entry {pair!r}")
        pairs.append((int(pair[0]), int(pair[1])))
    return pairs


def frame_counts(frames, expected: str = "frames must be a positive latent frame count or a list of them, "
                                         "e.g. 21 or [21, 31]") -> list[int]:
    """`warmup`'s `frames`: None, a positive int or a list of them (latent frames); a clear error (`expected`) for
    anything else."""
    if frames is None:
        return []
    values = [frames] if isinstance(frames, int) and not isinstance(frames, bool) else frames
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise TypeError(f"warmup: {expected}; got {frames!r}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"warmup: {expected}; got the entry {value!r}")
    return list(values)
