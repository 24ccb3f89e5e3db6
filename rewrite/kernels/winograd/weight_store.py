"""The transformed weights (`transforms.transformed_weight`) of the convs an op serves by Winograd F(2x2, 3x3), one
per weight.

An op hands the F(2x2, 3x3) kernel a conv weight transformed into [16, kt * C, O]: computed per call by torch it
costs about what the kernel gains (docs/tuning.md 1.21), so `transformed_for` keeps one per weight tensor and returns
it on later calls. The entry dies with its weight (a module's weights, or the channels-last copies its runner keeps,
die with the module: the memory goes with them). F(4x4, 3x3)'s transform is not kept: `weight_points`' kernels
compute it on every call (`rewrite.models.wan.ops_fast`), for the reason its docstring gives.

Staleness: a CUDA graph replays the kernels it captured and reads the kept tensor, not the weight. So the op asks
for a `refresh` on the first chunk of every decode (the causal conv's ``chunk0`` mode, which every decode runs
first and which is captured in a graph of its own): the transform is recomputed from the weight's current values
into the kept tensor, and an in-place weight update (`load_state_dict`) reaches the next decode, as the
channels-last weight copies' refresh does (`rewrite.models.wan.conv_weights`).
"""

from __future__ import annotations

import weakref
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.kernels.winograd.transforms import transformed_weight

__all__ = ["transformed_for"]


class _Kept(NamedTuple):
    weight: weakref.ref  # to the weight the transform was computed from
    dtype: torch.dtype  # the weight's dtype then
    transformed: tuple[Tensor, ...]


# (id(weight), output block: 2, the one form kept) -> its kept transform
_TRANSFORMED: dict[tuple[int, int], _Kept] = {}


def _forget(key: tuple[int, int], reference: weakref.ref) -> None:
    entry = _TRANSFORMED.get(key)
    if entry is not None and entry.weight is reference:
        del _TRANSFORMED[key]


def _matches(entry: _Kept, weight: Tensor) -> bool:
    """The kept tensors still fit the weight (a parameter keeps its identity when `.data` is swapped, as
    `module.to(...)` does: another dtype, device or shape then needs a new transform)."""
    out_channels, in_channels, taps = weight.shape[:3]
    transformed = entry.transformed[0]
    return (entry.dtype == weight.dtype and transformed.device == weight.device
            and tuple(transformed.shape[1:]) == (taps * in_channels, out_channels))


def _kept(weight: Tensor, refresh: bool, output_block: int,
          transform: Callable[[Tensor, Optional[tuple[Tensor, ...]]], tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """The kept transform of `weight`, made or refreshed by ``transform(weight, out)`` (`out`: the kept tensors to
    write into, or None for new ones)."""
    key = (id(weight), output_block)
    entry = _TRANSFORMED.get(key)
    with torch.no_grad():
        if entry is None or entry.weight() is not weight or not _matches(entry, weight):
            reference = weakref.ref(weight, lambda ref, key=key: _forget(key, ref))
            entry = _TRANSFORMED[key] = _Kept(reference, weight.dtype, transform(weight.detach(), None))
        elif refresh:
            transform(weight.detach(), entry.transformed)
    return entry.transformed


def transformed_for(weight: Tensor, refresh: bool) -> Tensor:
    """`transformed_weight(weight)` (F(2x2, 3x3)) in the weight's dtype, kept while `weight` lives: computed on the
    first call for this weight tensor, recomputed into the kept tensor where `refresh`, else the kept one as it is."""
    def transform(w: Tensor, out: Optional[tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
        fresh = transformed_weight(w)
        return (fresh,) if out is None else (out[0].copy_(fresh),)

    return _kept(weight, refresh, 2, transform)[0]
