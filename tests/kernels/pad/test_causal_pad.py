"""The causal conv's input assembly kernels (cache frames, x, zero pad) writing channels-last: pure data movement,
`torch.equal` to the ATen pad and cat they replace (CPU under the Triton interpreter, and CUDA)."""

from __future__ import annotations

import pytest
import torch

from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.models.wan import reference as wan_reference
from rewrite.models.wan import upsample_fast as wan_upsample_fast
from rewrite.ops.dispatch import use_backend
from tests.kernels.norm.test_rms_norm import DEVICE, DTYPES, _frame_major, needs_kernels


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
@pytest.mark.parametrize("shape,pad,cache_frames", [((1, 5, 1, 4, 7), [1, 1, 1, 1, 0, 0], 2),
                                                    ((2, 70, 2, 3, 66), [1, 1, 1, 1, 2, 0], 0),
                                                    ((1, 3, 3, 2, 5), [0, 0, 0, 0, 2, 0], 0),
                                                    ((1, 96, 1, 2, 3), [0, 0, 0, 0, 0, 0], 2),
                                                    # a band graph's halo row band: columns padded, rows not
                                                    ((1, 5, 1, 6, 7), [1, 1, 0, 0, 0, 0], 2),
                                                    ((2, 7, 1, 5, 6), [1, 1, 0, 0, 2, 0], 0)])
def test_channels_last_causal_pad_is_exact(dtype, layout, shape, pad, cache_frames):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=g).to(DEVICE, dtype)
    x = _frame_major(x) if layout == "frame_major" else x
    cache = torch.randn(shape[0], shape[1], cache_frames, *shape[3:], generator=g).to(DEVICE, dtype) if cache_frames else None
    source = x if cache is None else torch.cat([cache, x], 2)
    expected = torch.nn.functional.pad(source, pad)
    temporal = torch.nn.functional.pad(source, [0, 0, 0, 0, pad[4], 0])
    with use_backend("triton"):
        actual, next_cache = triton_pad.causal_pad_channels_last(x, cache, pad)
    assert actual.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(actual, expected)
    assert torch.equal(next_cache, temporal[:, :, -2:])  # the last two frames before the right pad
    mode = "chunk0" if cache is None else ("steady_t1" if shape[2] == 1 else "steady")
    if (cache is not None or pad[4] >= 1) and (mode != "chunk0" or shape[2] == 1):  # chunk 0 has one frame
        assert torch.equal(next_cache, wan_reference.next_cache_reference(x, cache, mode))


def _bf16_x_and_cache(shape, cache_frames: int, seed: int):
    """A random bf16 x of `shape` and a cache of `cache_frames` frames beside it (None for 0)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(DEVICE, torch.bfloat16)
    if not cache_frames:
        return x, None
    return x, torch.randn(shape[0], shape[1], cache_frames, *shape[3:], generator=g).to(DEVICE, torch.bfloat16)


@needs_kernels
@pytest.mark.parametrize("shape,pad,cache_frames,out_channels", [((1, 3, 1, 5, 7), [1, 1, 1, 1, 2, 0], 0, 16),
                                                                 ((2, 3, 4, 4, 6), [1, 1, 1, 1, 0, 0], 2, 16),
                                                                 ((1, 12, 1, 3, 5), [1, 1, 1, 1, 0, 0], 2, 16),
                                                                 ((1, 5, 2, 3, 4), [1, 1, 1, 1, 2, 0], 0, 5)])
def test_channels_last_causal_pad_widened_is_exact(shape, pad, cache_frames, out_channels):
    """With `out_channels` (a 3-channel video widened for the Triton conv): the padded input's first channels
    as without it, the rest zero, and the next cache x's channels only."""
    x, cache = _bf16_x_and_cache(shape, cache_frames, seed=4)
    with use_backend("triton"):
        expected, expected_cache = triton_pad.causal_pad_channels_last(x, cache, pad)
        actual, next_cache = triton_pad.causal_pad_channels_last(x, cache, pad, out_channels=out_channels)
    assert actual.shape[1] == out_channels and actual.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(actual[:, :shape[1]], expected)
    assert torch.equal(actual[:, shape[1]:], torch.zeros_like(actual[:, shape[1]:]))
    assert torch.equal(next_cache, expected_cache) and next_cache.shape[1] == shape[1]
    with pytest.raises(ValueError, match="fewer than x's"):
        triton_pad.causal_pad_channels_last(x, cache, pad, out_channels=shape[1] - 1)


@needs_kernels
@pytest.mark.parametrize("layout", ("contiguous", "frame_major", "frames_of_ncdhw"))
@pytest.mark.parametrize("shape,pad", [((1, 5, 3, 4, 7), [1, 1, 1, 1, 0, 0]), ((2, 70, 1, 3, 66), [1, 2, 0, 1, 1, 1])])
def test_channels_last_pad_is_exact(layout, shape, pad):
    """`pad_channels_last` (no cache, no next cache) and the upsampler's padded source built from it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g).to(DEVICE, torch.bfloat16)
    x = {"contiguous": x, "frame_major": _frame_major(x),
         "frames_of_ncdhw": x.transpose(0, 2).contiguous().transpose(0, 2)}[layout]
    with use_backend("triton"):
        actual = triton_pad.pad_channels_last(x, pad)
        frames = x[0].transpose(0, 1)  # [T, C, H, W]: the per-frame view an upsampler's conv reads
        source = wan_upsample_fast.padded_source(frames)
    assert actual.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(actual, torch.nn.functional.pad(x, pad))
    assert source.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(source, torch.nn.functional.pad(frames, [1, 1, 1, 1]))


@needs_kernels
@pytest.mark.parametrize("shape,pad,cache_frames", [((1, 3, 1, 5, 7), [1, 1, 1, 1, 2, 0], 0),
                                                    ((2, 3, 4, 4, 6), [1, 1, 1, 1, 0, 0], 2),
                                                    ((1, 5, 1, 3, 9), [1, 1, 1, 1, 0, 0], 2)])
def test_channels_last_causal_pad_folded_is_exact(shape, pad, cache_frames):
    """Channel k * C + c of column w is the padded input's column w + k: the unfold of the padded input along
    the width, zeros past 3 * C channels; the next cache as without folding."""
    x, cache = _bf16_x_and_cache(shape, cache_frames, seed=6)
    with use_backend("triton"):
        padded, expected_cache = triton_pad.causal_pad_channels_last(x, cache, pad)
        actual, next_cache = triton_pad.causal_pad_channels_last_folded(x, cache, pad, 3, 16)
    c, w = shape[1], shape[4]
    unfolded = torch.cat([padded[..., k:k + w] for k in range(3)], 1)  # [B, 3C, T, H, W], tap-major
    assert actual.shape[1] == 16 and actual.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(actual[:, :3 * c], unfolded)
    assert torch.equal(actual[:, 3 * c:], torch.zeros_like(actual[:, 3 * c:]))
    assert torch.equal(next_cache, expected_cache)
    with pytest.raises(ValueError, match="width pad"):
        triton_pad.causal_pad_channels_last_folded(x, cache, [0, 2, 1, 1, 0, 0], 3, 16)
    with pytest.raises(ValueError, match="exceed"):
        triton_pad.causal_pad_channels_last_folded(x, cache, pad, 3, 3 * c - 1)
