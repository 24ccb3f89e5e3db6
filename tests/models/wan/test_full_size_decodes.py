"""Full-size Wan decoders on CUDA: `lossless` is torch.equal to `off` (random init, seeded latents)."""

from __future__ import annotations

import pytest
import torch

from rewrite import optimize, report
from rewrite.models.wan.config import build_wan

pytestmark = pytest.mark.gpu


def _latents(vae, frames: int, height: int, width: int, dtype, seed: int = 0) -> torch.Tensor:
    ratio = vae.spatial_compression_ratio
    shape = (1, vae.config.z_dim, 1 + (frames - 1) // 4, height // ratio, width // ratio)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to("cuda", dtype)


def _assert_lossless_decode_equal(version: str, frames: int, height: int, width: int) -> None:
    """A full-size bf16 decoder's `lossless` decode through its CUDA graphs is torch.equal to its `off` decode."""
    vae = build_wan(version, "full").to("cuda", torch.bfloat16)
    z = _latents(vae, frames, height, width, torch.bfloat16)
    with torch.no_grad():
        expected = vae.decode(z).sample
        optimize(vae, level="lossless")
        actual = vae.decode(z).sample
    assert report(vae).last_path == "graphs", report(vae)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("version", ("wan2.1", "wan2.2"))
@pytest.mark.parametrize("height,width", ((480, 832), (720, 1280)), ids=("480p", "720p"))
def test_full_size_81_frames_bit_identical(version, height, width):
    _assert_lossless_decode_equal(version, 81, height, width)


@pytest.mark.parametrize("version", ("wan2.1", "wan2.2"))
@pytest.mark.parametrize("height,width", ((1088, 1920), (1920, 1088)), ids=("1088x1920", "1920x1088"))
def test_1080p_bit_identical(version, height, width):
    """1080p: Wan 2.1's last-stage norms reduce an fp32 copy of 3.2 GB, which ATen sums in 32-bit pieces
    (`aten_reduction.split_plan`); the fused norm follows them."""
    _assert_lossless_decode_equal(version, 9, height, width)


@pytest.mark.parametrize("version", ("wan2.1", "wan2.2"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16), ids=str)
def test_full_size_other_dtypes_bit_identical(dtype, version):
    vae = build_wan(version, "full").to("cuda", dtype)
    z = _latents(vae, 9, 480, 832, dtype, seed=1)
    with torch.no_grad():
        expected = vae.decode(z).sample
        optimize(vae, level="lossless")
        actual = vae.decode(z).sample
    assert report(vae).last_path == "graphs"
    assert torch.equal(actual, expected)


def test_two_resolutions_and_weight_reload_after_capture():
    vae = build_wan("wan2.1", "full").to("cuda", torch.bfloat16)
    optimize(vae)
    reference = build_wan("wan2.1", "full").to("cuda", torch.bfloat16)
    with torch.no_grad():
        for height, width in ((480, 832), (256, 320)):
            z = _latents(vae, 9, height, width, torch.bfloat16)
            assert torch.equal(vae.decode(z).sample, reference.decode(z).sample), (height, width)
        captured = _bf16_graphs(vae)
        new_weights = build_wan("wan2.1", "full", seed=3).to("cuda", torch.bfloat16).state_dict()
        vae.load_state_dict(new_weights)
        reference.load_state_dict(new_weights)
        z = _latents(vae, 9, 256, 320, torch.bfloat16, seed=2)
        assert torch.equal(vae.decode(z).sample, reference.decode(z).sample)
    # chunk 0 and steady per size (each of the runner's first STATIC_SIZES sizes has its own), and the reload
    # captured nothing anew: the graphs read the weights by name
    assert captured == 2 * 2 and _bf16_graphs(vae) == captured


def _bf16_graphs(vae) -> int:
    return sum(g.dtype == "torch.bfloat16" for g in report(vae).graphs)


def test_cudnn_disabled_takes_the_reference_path():
    """The graphs defer conv biases as ATen's cuDNN path adds them; with cuDNN off the decode is the reference's."""
    vae = build_wan("wan2.2", "tiny").to("cuda", torch.bfloat16)
    reference = build_wan("wan2.2", "tiny").to("cuda", torch.bfloat16)
    optimize(vae)
    z = torch.randn((1, vae.config.z_dim, 2, 4, 6), generator=torch.Generator().manual_seed(4)).to("cuda", torch.bfloat16)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=False):
        assert torch.equal(vae.decode(z).sample, reference.decode(z).sample)
        assert report(vae).last_path == "reference"
        assert "cuDNN is disabled" in report(vae).last_reason
