"""What the Winograd convs keep per weight: F(2x2, 3x3)'s transformed weight, F(4x4, 3x3)'s 36 point scales.

An op hands the F(2x2, 3x3) kernel a conv weight transformed into [16, kt * C, O]: computed per call by torch it
costs about what the kernel gains (docs/tuning.md 1.21), so `transformed_for` keeps one per weight tensor and returns
it on later calls. F(4x4, 3x3)'s transform is 4x the weight's elements in fp16: kept, those took 1.6 GiB at Wan 2.2's
720p and put the decode's peak over `off`'s (tuning.md 1.27), so `transformed_4_for` keeps only its 36 point scales
(the slower of `weight_points`' two passes, tuning.md 1.27) and runs the second pass in each call, into a
temporary given back after the conv. An entry dies with its weight (a module's weights, or the channels-last copies
its runner keeps, die with the module: the memory goes with them).

Staleness: a CUDA graph replays the kernels it captured and reads the kept tensor, not the weight (nor, for the
scales, the weight's present magnitudes). So the op asks for a `refresh` on the first chunk of every decode (the
causal conv's ``chunk0`` mode, which every decode runs first and which is captured in a graph of its own): the kept
tensor is recomputed from the weight's current values, and an in-place weight update (`load_state_dict`) reaches
the next decode, as the channels-last weight copies' refresh does (`rewrite.models.wan.conv_weights`).
"""

from __future__ import annotations

import weakref
from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.kernels.winograd import weight_points
from rewrite.kernels.winograd.transforms import POINTS_4, points_shape_4, transformed_weight, transformed_weight_4

__all__ = ["transformed_4_for", "transformed_for"]


class _Kept(NamedTuple):
    weight: weakref.ref  # to the weight the transform was computed from
    dtype: torch.dtype  # the weight's dtype then
    shape: tuple[int, ...]  # and its shape
    transformed: tuple[Tensor, ...]


# (id(weight), output block: 2 or 4) -> what is kept for it
_TRANSFORMED: dict[tuple[int, int], _Kept] = {}


def _forget(key: tuple[int, int], reference: weakref.ref) -> None:
    entry = _TRANSFORMED.get(key)
    if entry is not None and entry.weight is reference:
        del _TRANSFORMED[key]


def _matches(entry: _Kept, weight: Tensor) -> bool:
    """The kept tensors still fit the weight (a parameter keeps its identity when `.data` is swapped, as
    `module.to(...)` does: another dtype, device or shape then needs a new transform)."""
    return (entry.dtype == weight.dtype and entry.transformed[0].device == weight.device
            and entry.shape == tuple(weight.shape))


def _kept(weight: Tensor, refresh: bool, output_block: int,
          transform: Callable[[Tensor, Optional[tuple[Tensor, ...]]], tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """The kept transform of `weight`, made or refreshed by ``transform(weight, out)`` (`out`: the kept tensors to
    write into, or None for new ones)."""
    key = (id(weight), output_block)
    entry = _TRANSFORMED.get(key)
    with torch.no_grad():
        if entry is None or entry.weight() is not weight or not _matches(entry, weight):
            reference = weakref.ref(weight, lambda ref, key=key: _forget(key, ref))
            entry = _TRANSFORMED[key] = _Kept(reference, weight.dtype, tuple(weight.shape),
                                              transform(weight.detach(), None))
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


def transformed_4_for(weight: Tensor, refresh: bool) -> tuple[Tensor, Tensor]:
    """`transforms.transformed_weight_4(weight)` (F(4x4, 3x3): fp16 points and their fp32 scales): the points
    computed in this call by `weight_points`' second pass, with the 36 scales kept while `weight` lives (computed on
    the first call for this weight tensor, recomputed into the kept tensor where `refresh`). Where the kernels do not
    serve the weight (`weight_points.kernels_serve`), torch's whole transform, nothing kept."""
    if not weight_points.kernels_serve(weight):
        return transformed_weight_4(weight.detach())

    def scales(w: Tensor, out: Optional[tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
        kept = torch.empty(POINTS_4, dtype=torch.float32, device=w.device) if out is None else out[0]
        weight_points.point_scales_4_into(w, kept)
        return (kept,)

    shape = points_shape_4(weight)  # the weight's shape checked before anything is kept
    u = torch.empty(shape, dtype=torch.float16, device=weight.device)
    point_scales = _kept(weight, refresh, 4, scales)[0]
    weight_points.scaled_points_4_into(weight.detach(), point_scales, u)
    return u, point_scales
