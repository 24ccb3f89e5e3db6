"""The quick run and the whole run: which parametrized cases the README's test command runs.

The README's command (``pytest -n 2``, ``slow`` deselected in pyproject's ``addopts``) runs a representative
subset of the long parametrized grids; CI then runs ``pytest -m slow``, which adds every other case and the
full-size and multi-process tests, so CI still runs everything. A case left out of the quick run is one more
point of a grid whose axes the quick run already covers (each axis value at least once where the grid allows),
never the only test of a behaviour.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Hashable, Sequence

import pytest

slow = pytest.mark.slow


def spread(items: Sequence[Any], count: int) -> list[Any]:
    """`count` of `items` evenly spaced from the first to the last (all of them when there are not more)."""
    if len(items) <= count:
        return list(items)
    if count == 1:
        return [items[0]]
    return [items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)]


def spread_per_group(values: Sequence[Any], group: Callable[[Any], Hashable], count: int) -> set[int]:
    """The indices of `count` evenly spread values of each `group` (in `values`' order)."""
    groups: dict[Hashable, list[int]] = {}
    for index, value in enumerate(values):
        groups.setdefault(group(value), []).append(index)
    return {index for indices in groups.values() for index in spread(indices, count)}


def grid(values: Sequence[Any], group: Callable[[Any], Hashable], count: int,
         ids: Callable[[Any], str] | None = None, unpack: bool = False) -> list:
    """`params` of `values` where the quick ones are `count` evenly spread per `group`."""
    keep = spread_per_group(values, group, count)
    return [pytest.param(*(tuple(v) if unpack else (v,)), id=ids(v) if ids else None,
                         marks=() if i in keep else slow) for i, v in enumerate(values)]


def product(*axes: dict[str, tuple]) -> list:
    """The product of `axes` (each ``{id: argument values}``) as ``pytest.param``s of the concatenated values,
    ids joined by "-". Quick: for each value of the first axis, one combination of the others, counted in mixed
    radix (the first axis's index, digit by digit over the other axes), so that every value of every axis runs
    when the first axis has at least as many values as the other axes have combinations."""
    first, *others = axes
    sizes = [len(axis) for axis in others]
    out = []
    for i, (first_id, first_values) in enumerate(first.items()):
        digits, rest = [], i
        for size in sizes:
            digits.append(rest % size)
            rest //= size
        for combo in itertools.product(*(enumerate(axis.items()) for axis in others)):
            values = first_values + tuple(v for _, (_, axis_values) in combo for v in axis_values)
            ident = "-".join([first_id] + [axis_id for _, (axis_id, _) in combo])
            is_quick = [index for index, _ in combo] == digits
            out.append(pytest.param(*values, id=ident, marks=() if is_quick else slow))
    return out
