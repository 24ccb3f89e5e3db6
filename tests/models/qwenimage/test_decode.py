"""Qwen-Image's VAE (diffusers `AutoencoderKLQwenImage`, tiny random-init config) through `optimize` on the CPU.

`lossless` is `torch.equal` to diffusers' own decode in bf16, fp16 and fp32, for images (one latent frame),
batches of 2, odd latent sizes and a few-frame clip; `channels_last` keeps the Wan contract (`rewrite.contract`
against `off`, fp32 `torch.equal`); calls the graphs cannot serve run diffusers' code
with a logged reason; `group=` (the sharded Wan decode) is refused before anything is installed.
"""

from __future__ import annotations

import logging

import pytest
import torch

from rewrite import optimize, report
from rewrite.contract import video_difference
from rewrite.models.qwenimage.config import build_qwenimage, latent_shape


_PAIRS: dict = {}


def _pair(dtype: torch.dtype, level: str = "lossless"):
    """(reference, optimized): the same seeded weights; cached per dtype and level (one capture each)."""
    key = (dtype, level)
    if key not in _PAIRS:
        _PAIRS[key] = (build_qwenimage("tiny").to(dtype), optimize(build_qwenimage("tiny").to(dtype), level=level))
    return _PAIRS[key]


def _latents(vae, batch: int, height: int, width: int, frames: int = 1, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(latent_shape(vae, batch, height, width, frames), generator=generator).to(vae.dtype)


def _decode_both(reference, optimized, z):
    with torch.no_grad():
        return reference.decode(z).sample, optimized.decode(z).sample


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("batch,height,width", ((1, 4, 6), (2, 4, 6), (1, 7, 5), (2, 3, 9)))
def test_lossless_image_decode_is_bit_identical(dtype, batch, height, width):
    reference, optimized = _pair(dtype)
    z = _latents(reference, batch, height, width)
    expected, actual = _decode_both(reference, optimized, z)
    assert actual.shape == (batch, 3, 1, 8 * height, 8 * width)
    assert torch.equal(actual, expected)
    assert report(optimized).last_path == "graphs"


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_lossless_clip_of_several_latent_frames_is_bit_identical(dtype):
    reference, optimized = _pair(dtype)
    z = _latents(reference, 1, 5, 4, frames=3, seed=1)
    expected, actual = _decode_both(reference, optimized, z)
    assert actual.shape == (1, 3, 9, 40, 32)  # 1 + 4 (frames - 1): the Wan 2.1 temporal upsampling
    assert torch.equal(actual, expected)
    assert report(optimized).last_path == "graphs"


def test_return_dict_false_and_tiling():
    reference, optimized = _pair(torch.float32)
    z = _latents(reference, 1, 4, 6)
    with torch.no_grad():
        (actual,) = optimized.decode(z, return_dict=False)
        assert torch.equal(actual, reference.decode(z).sample)
    tiled_reference, tiled = build_qwenimage("tiny"), optimize(build_qwenimage("tiny"), level="lossless")
    for vae in (tiled_reference, tiled):
        vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32,
                          tile_sample_stride_height=24, tile_sample_stride_width=24)
    z = _latents(tiled_reference, 1, 7, 9, seed=2)
    expected, actual = _decode_both(tiled_reference, tiled, z)
    assert torch.equal(actual, expected)  # Qwen-Image's tiled_decode does not clamp, as diffusers' own


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
def test_channels_last_keeps_the_wan_contract(dtype):
    reference, optimized = _pair(dtype, "channels_last")
    for batch, height, width in ((1, 4, 6), (2, 7, 5)):
        expected, actual = _decode_both(reference, optimized, _latents(reference, batch, height, width, seed=3))
        assert report(optimized).last_path == "graphs"
        if dtype == torch.float32:  # fp32 keeps the lossless ops
            assert torch.equal(actual, expected)
            continue
        difference = video_difference(actual, expected)
        assert difference.violation() is None, f"{difference}: {difference.violation()}"


def test_a_call_the_graphs_cannot_serve_runs_diffusers_code_with_a_logged_reason(caplog):
    reference, optimized = _pair(torch.float32)
    z = _latents(reference, 1, 4, 6, seed=4)
    with caplog.at_level(logging.INFO, logger="rewrite"):
        actual = optimized.decode(z).sample  # grad mode on: the graphs do not serve autograd
    with torch.no_grad():
        assert torch.equal(actual, reference.decode(z).sample)
    assert report(optimized).last_path != "graphs"
    assert any("grad" in r.getMessage() for r in caplog.records)


def test_bad_latents_raise_a_value_error():
    _, optimized = _pair(torch.float32)
    with pytest.raises(ValueError, match="latents must be"):
        optimized.decode(torch.zeros(1, 16, 1, 4, 4))


def test_a_sharded_decode_is_refused_before_anything_is_installed(monkeypatch):
    from rewrite.models.wan.distributed import sharding

    monkeypatch.setattr(sharding, "_group_error", lambda group: None)  # any group: the model is what is refused
    vae = build_qwenimage("tiny")
    with pytest.raises(TypeError, match="group= is for the Wan VAE"):
        optimize(vae, level="lossless", group=object())
    assert "_decode" not in vae.__dict__


def test_off_undoes_it():
    vae = optimize(build_qwenimage("tiny"), level="lossless")
    optimize(vae, level="off")
    assert "_decode" not in vae.__dict__ and "forward" not in vae.decoder.__dict__
