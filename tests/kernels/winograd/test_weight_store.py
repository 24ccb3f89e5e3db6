"""The kept transformed weights of the Winograd convs (`rewrite.kernels.winograd.weight_store`): kept per weight,
recomputed on request, given back with the weight."""

from __future__ import annotations

import gc

import torch

from rewrite.kernels.winograd import weight_store
from rewrite.kernels.winograd.transforms import transformed_weight


def _weight(seed: int, out_channels: int = 8, in_channels: int = 4) -> torch.Tensor:
    return torch.randn(out_channels, in_channels, 3, 3, 3, generator=torch.Generator().manual_seed(seed))


def test_a_weight_is_transformed_once_and_its_transform_kept():
    weight = _weight(0)
    first = weight_store.transformed_for(weight, refresh=False)
    assert torch.equal(first, transformed_weight(weight))
    assert weight_store.transformed_for(weight, refresh=False) is first  # no second transform
    assert weight_store.transformed_for(weight.clone(), refresh=False) is not first  # another tensor, its own


def test_an_in_place_update_reaches_the_kept_transform_on_refresh_only():
    """Without `refresh` the kept tensor is what a CUDA graph would read: the old transform. With it, the new
    weight's transform is written into the same tensor (the graphs' captured address)."""
    weight = _weight(1)
    kept = weight_store.transformed_for(weight, refresh=False)
    old = kept.clone()
    weight.mul_(2)
    assert torch.equal(weight_store.transformed_for(weight, refresh=False), old)
    assert weight_store.transformed_for(weight, refresh=True) is kept
    assert torch.equal(kept, transformed_weight(weight)) and not torch.equal(kept, old)


def test_a_swapped_dtype_or_shape_gets_a_new_transform():
    """`module.to(dtype)` swaps a parameter's data and keeps the parameter: the kept transform must follow."""
    weight = torch.nn.Parameter(_weight(2))
    first = weight_store.transformed_for(weight, refresh=False)
    weight.data = weight.data.to(torch.bfloat16)
    second = weight_store.transformed_for(weight, refresh=False)
    assert second is not first and second.dtype == torch.bfloat16
    weight.data = _weight(3, out_channels=6).to(torch.bfloat16)
    assert weight_store.transformed_for(weight, refresh=False).shape == (16, 12, 6)


def test_the_transform_is_given_back_when_its_weight_goes():
    import weakref

    weight = _weight(4)
    transformed = weakref.ref(weight_store.transformed_for(weight, refresh=False))
    gc.collect()
    assert transformed() is not None  # kept while the weight lives
    del weight
    gc.collect()
    assert transformed() is None


def test_the_large_tile_keeps_only_its_point_scales_and_refreshes_them_in_place():
    """F(4x4, 3x3): the 36 scales are kept per weight (one [36] tensor, refreshed in place on request), the points
    are computed in each call with them: the bits of `transformed_weight_4`. Where the kernels do not serve the
    weight, torch's whole transform runs and nothing is kept."""
    from rewrite.kernels.winograd import weight_points
    from rewrite.kernels.winograd.transforms import transformed_weight_4

    weight = _weight(5)
    u, scales = weight_store.transformed_4_for(weight, refresh=False)
    fresh_u, fresh_scales = transformed_weight_4(weight)
    assert torch.equal(u, fresh_u) and torch.equal(scales, fresh_scales)
    if not weight_points.kernels_serve(weight):
        assert not [key for key in weight_store._TRANSFORMED if key[0] == id(weight)]
        return
    again_u, again_scales = weight_store.transformed_4_for(weight, refresh=False)
    assert again_scales is scales and again_u is not u and torch.equal(again_u, u)
    kept = [entry.transformed for key, entry in weight_store._TRANSFORMED.items() if key[0] == id(weight)]
    assert len(kept) == 1 and kept[0][0] is scales and scales.shape == (36,)  # the points are not kept
    with torch.no_grad():
        weight.mul_(8)  # every point 8x: its scale 8x smaller
    assert torch.equal(scales, fresh_scales)  # kept as they were until refreshed
    refreshed_u, refreshed_scales = weight_store.transformed_4_for(weight, refresh=True)
    new_u, new_scales = transformed_weight_4(weight)
    assert refreshed_scales is scales and torch.equal(scales, new_scales) and torch.equal(refreshed_u, new_u)
    assert torch.equal(new_scales * 8, fresh_scales)
