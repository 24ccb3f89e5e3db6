"""`vae.encode` of an optimized Wan-family VAE (`rewrite.models.wan.encode`): bit for bit diffusers' `_encode` at
``lossless`` through the encoder's step graphs, the fallbacks with their reasons, the bad-input errors, and the
CUDA-graph steps sharing the decoder's graph memory (stand-in graphs: `tests.graph_fakes.FakeGraphs`).

CPU, tiny configs with perturbed norms (`build_wan`, `build_qwenimage`); every equality is `torch.equal`.
"""

from __future__ import annotations

import copy
import functools
import pickle

import pytest
import torch

from rewrite import optimize, report, warmup
from rewrite.models.qwenimage import runner as _qwenimage  # noqa: F401  (registers the family's class names)
from rewrite.models.qwenimage.config import build_qwenimage
from rewrite.models.wan.config import build_wan
from rewrite.models.wan.encode import TILED_ENCODE
from rewrite.runtime.runner import installed_runner
from tests.graph_fakes import FakeGraphs

BUILDERS = {"wan2.1": lambda: build_wan("wan2.1", "tiny"), "wan2.2": lambda: build_wan("wan2.2", "tiny"),
            "qwenimage": lambda: build_qwenimage("tiny")}


@functools.lru_cache(maxsize=None)
def _reference(model: str, dtype: torch.dtype = torch.float32):
    return BUILDERS[model]().to(dtype)


def _optimized(model: str, dtype: torch.dtype = torch.float32, level: str = "lossless", **options):
    return optimize(copy.deepcopy(_reference(model, dtype)), level, **options)


def _video(shape, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _assert_encodes_equal(optimized, reference, video) -> None:
    with torch.no_grad():
        actual, expected = optimized.encode(video).latent_dist, reference.encode(video).latent_dist
    assert torch.equal(actual.mean, expected.mean) and torch.equal(actual.logvar, expected.logvar)
    assert torch.equal(actual.mode(), expected.mode())
    sample = actual.sample(torch.Generator().manual_seed(3))
    assert torch.equal(sample, expected.sample(torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("model", ("wan2.1", "wan2.2"))
@pytest.mark.parametrize("shape", ((1, 3, 9, 32, 48), (2, 3, 5, 48, 80), (1, 3, 1, 32, 48), (1, 3, 7, 32, 64),
                                   (2, 3, 1, 16, 16)), ids=str)
def test_lossless_encode_is_diffusers_encode(model, shape):
    optimized = _optimized(model)
    _assert_encodes_equal(optimized, _reference(model), _video(shape))
    assert report(optimized).last_path == "graphs"


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_lossless_encode_in_half_precision(dtype):
    # fp16 and bf16 convs on this CPU round as the encoder's own modules do: the graphs call the same ATen ops
    optimized = _optimized("wan2.1", dtype)
    _assert_encodes_equal(optimized, _reference("wan2.1", dtype), _video((2, 3, 5, 32, 48), dtype))


def test_odd_sizes_that_diffusers_takes():
    optimized = _optimized("wan2.1")
    for seed, shape in enumerate(((1, 3, 5, 33, 47), (1, 3, 5, 34, 50))):
        _assert_encodes_equal(optimized, _reference("wan2.1"), _video(shape, seed=seed))
    assert report(optimized).last_path == "graphs"


def test_a_size_diffusers_refuses_raises_its_error():
    # Wan 2.2's AvgDown3D shortcut folds 2x2 patches of the patchified video: 36x52 is refused by diffusers' reshape
    optimized, video = _optimized("wan2.2"), _video((1, 3, 5, 36, 52))
    with torch.no_grad(), pytest.raises(RuntimeError) as expected:
        _reference("wan2.2").encode(video)
    with torch.no_grad(), pytest.raises(RuntimeError) as actual:
        optimized.encode(video)
    assert str(actual.value) == str(expected.value)


def test_qwenimage_encodes_images_and_clips():
    optimized = _optimized("qwenimage")
    for shape in ((2, 3, 1, 32, 48), (1, 3, 5, 32, 48)):
        _assert_encodes_equal(optimized, _reference("qwenimage"), _video(shape))
    assert report(optimized).last_path == "graphs"


def test_slicing_encodes_each_item_through_the_graphs():
    optimized, reference = _optimized("wan2.1"), copy.deepcopy(_reference("wan2.1"))
    optimized.enable_slicing(), reference.enable_slicing()
    _assert_encodes_equal(optimized, reference, _video((2, 3, 5, 32, 48)))
    assert report(optimized).last_path == "graphs"


def test_a_tiled_encode_runs_diffusers_code_and_says_so():
    optimized, reference = _optimized("wan2.1"), copy.deepcopy(_reference("wan2.1"))
    for vae in (optimized, reference):
        vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=16,
                          tile_sample_stride_width=16)
    _assert_encodes_equal(optimized, reference, _video((1, 3, 5, 48, 64)))
    assert report(optimized).last_path == "reference" and report(optimized).last_reason == TILED_ENCODE


def test_autograd_and_hooks_take_the_reference_with_a_reason():
    optimized, reference, video = _optimized("wan2.1"), _reference("wan2.1"), _video((1, 3, 5, 32, 48))
    with torch.no_grad():
        expected = reference.encode(video).latent_dist.mean
    assert torch.equal(optimized.encode(video).latent_dist.mean.detach(), expected)  # grad mode on
    assert report(optimized).last_path == "reference"
    assert report(optimized).last_reason.startswith("autograd enabled and the VAE parameters require grad (for the "
                                                     "graphs, encode under torch.no_grad()")
    handle = optimized.encoder.down_blocks[0].register_forward_hook(lambda *args: None)
    with torch.no_grad():
        assert torch.equal(optimized.encode(video).latent_dist.mean, expected)
    assert "hooks" in report(optimized).last_reason
    handle.remove()
    with torch.no_grad():
        assert torch.equal(optimized.encode(video).latent_dist.mean, expected)
    assert report(optimized).last_path == "graphs"


@pytest.mark.parametrize("video,match", [
    (torch.zeros(3, 5, 32, 48), r"\[batch, 3, frames, height, width\]; got \(3, 5, 32, 48\)"),
    (torch.zeros(1, 4, 5, 32, 48), r"\[batch, 3, frames, height, width\]; got \(1, 4, 5, 32, 48\)"),
    (torch.zeros(1, 3, 0, 32, 48), "at least one batch item, frame"),
    (torch.zeros(1, 3, 5, 32, 48, dtype=torch.float64), "must be torch.float32"),
])
def test_a_bad_video_gets_an_error_naming_what_is_expected(video, match):
    optimized = _optimized("wan2.1")
    with torch.no_grad(), pytest.raises(ValueError, match=match):
        optimized.encode(video)


def test_off_gives_diffusers_encode_back():
    optimized = _optimized("wan2.1")
    assert "_encode" in optimized.__dict__
    optimize(optimized, "off")
    assert "_encode" not in optimized.__dict__


def test_encode_and_decode_share_one_graph_memory_and_replay_exactly():
    optimized, reference = _optimized("wan2.1"), _reference("wan2.1")
    backend = installed_runner(optimized).graph_backend = FakeGraphs()
    video = _video((1, 3, 9, 32, 48))
    with torch.no_grad():
        _assert_encodes_equal(optimized, reference, video)
        latents = reference.encode(video).latent_dist.mode()
        assert torch.equal(optimized.decode(latents).sample, reference.decode(latents).sample)
        _assert_encodes_equal(optimized, reference, _video((1, 3, 5, 32, 48), seed=1))  # replays: no capture
        _assert_encodes_equal(optimized, reference, _video((1, 3, 1, 16, 16), seed=2))  # one frame: chunk 0 alone
    assert [shape[2] for shape, _ in backend.captured] == [1, 4, 1, 1, 1]  # encode 32x48, decode, encode 16x16
    assert len({pool for _, pool in backend.captured}) == 1
    sizes = [size.size for size in report(optimized).graph_memory.sizes]
    assert sizes == ["1x4x6 float32 cpu", "1x32x48 float32 cpu encode", "1x16x16 float32 cpu encode one frame"]
    assert report(optimized).last_path == "graphs"


def test_warmup_captures_the_encoder_sizes_largest_first():
    optimized = _optimized("wan2.1")
    backend = installed_runner(optimized).graph_backend = FakeGraphs()
    result = warmup(optimized, encode_shapes=[(16, 16), (32, 48)])
    assert result.shapes == [(1, 16, 16, "encode"), (1, 32, 48, "encode")]
    assert [shape[-2:] for shape, _ in backend.captured] == [(32, 48), (32, 48), (16, 16), (16, 16)]
    warmup(optimized, encode_shapes=[(24, 24)], encode_frames=1)
    assert backend.captured[-1][0] == (1, 3, 1, 24, 24) and len(backend.captured) == 5  # chunk 0 alone
    _assert_encodes_equal(optimized, _reference("wan2.1"), _video((1, 3, 5, 32, 48)))
    assert len(backend.captured) == 5  # the warmed-up size replays
    with pytest.raises(ValueError, match="encode_shapes must be a list of"):
        warmup(optimized, encode_shapes=[(0, 16)])
    with pytest.raises(ValueError, match="encode_frames= needs encode_shapes"):
        warmup(optimized, encode_frames=5)


def test_channels_last_encodes_fp32_on_its_exact_ops():
    optimized = _optimized("wan2.1", level="channels_last")
    _assert_encodes_equal(optimized, _reference("wan2.1"), _video((1, 3, 5, 32, 48)))
    assert report(optimized).last_path == "graphs"


def test_deepcopy_and_pickle_keep_serving_the_encode():
    optimized, reference, video = _optimized("wan2.1"), _reference("wan2.1"), _video((1, 3, 5, 32, 48))
    with torch.no_grad():
        optimized.encode(video)  # captured before the copies
    for copied in (copy.deepcopy(optimized), pickle.loads(pickle.dumps(optimized))):
        _assert_encodes_equal(copied, reference, video)
        assert report(copied).last_path == "graphs"
    text = str(report(optimized))
    assert "encode_chunk0" in text and "pad_conv2d=3" in text and "time_conv=2" in text
