"""Full-size Wan encoders on CUDA (`rewrite.models.wan.encode`): `lossless` encodes are torch.equal to diffusers'
through the CUDA graphs; `channels_last` keeps the decoded video within the decoder's contract; an encode and a
decode of one module share one graph memory. Random-init encoders with perturbed gammas (`build_wan`), seeded
videos in [-1, 1].

The `channels_last` contract of an encode (README, levels): the posterior's mean against `off`'s within
`rewrite.contract`'s bound (PSNR >= 45 dB taken over a peak-to-peak of 2, max-abs within 1.5 times the Gaussian
extreme of the difference's RMS); checked here also where a user sees it, the latents' mode decoded at `off`
against the `off` encode's latents decoded the same way, within the decode contract.
"""

from __future__ import annotations

import pytest
import torch

from rewrite import optimize, report
from rewrite.contract import video_difference
from rewrite.models.wan.config import build_wan

pytestmark = pytest.mark.gpu


def _video(frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (2 * torch.rand(1, 3, frames, height, width, generator=generator) - 1).to("cuda", torch.bfloat16)


@pytest.mark.parametrize("version", ("wan2.1", "wan2.2"))
@pytest.mark.parametrize("height,width", ((480, 832), (720, 1280)), ids=("480p", "720p"))
def test_full_size_encode_bit_identical(version, height, width):
    vae = build_wan(version, "full").to("cuda", torch.bfloat16)
    video = _video(33, height, width)
    with torch.no_grad():
        expected = vae.encode(video).latent_dist
        optimize(vae, level="lossless")
        actual = vae.encode(video).latent_dist
    assert report(vae).last_path == "graphs", report(vae)
    assert torch.equal(actual.mean, expected.mean) and torch.equal(actual.logvar, expected.logvar)


@pytest.mark.parametrize("version,frames,height,width", (
    ("wan2.1", 33, 480, 832), ("wan2.2", 33, 480, 832),
    ("wan2.1", 9, 720, 1280),   # the H100's folded first conv, 1280 wide
    ("wan2.2", 9, 704, 1280),   # the H100's 256 + 64 split tiles at 176x320
), ids=("wan2.1-480p", "wan2.2-480p", "wan2.1-720p", "wan2.2-704p"))
def test_channels_last_encode_within_the_contract(version, frames, height, width):
    vae = build_wan(version, "full").to("cuda", torch.bfloat16)
    video = _video(frames, height, width)
    with torch.no_grad():
        expected_latents = vae.encode(video).latent_dist.mode()
        expected = vae.decode(expected_latents).sample
        optimize(vae, level="channels_last")
        actual_latents = vae.encode(video).latent_dist.mode()
        on_latents = video_difference(actual_latents, expected_latents)
        assert on_latents.violation() is None, f"latents: {on_latents}: {on_latents.violation()}"
        assert report(vae).last_path == "graphs"
        optimize(vae, level="off")
        actual = vae.decode(actual_latents).sample
    print(f"latents: {on_latents}; decoded: {video_difference(actual, expected)}")  # kept by `pytest -rA`
    difference = video_difference(actual, expected)
    assert difference.violation() is None, f"{difference}: {difference.violation()}"


def test_an_encode_and_a_decode_share_one_graph_memory():
    reference = build_wan("wan2.1", "full").to("cuda", torch.bfloat16)
    vae = optimize(build_wan("wan2.1", "full").to("cuda", torch.bfloat16), level="lossless")
    video = _video(17, 480, 832)
    with torch.no_grad():
        latents = reference.encode(video).latent_dist.mode()
        assert torch.equal(vae.encode(video).latent_dist.mode(), latents)
        assert torch.equal(vae.decode(latents).sample, reference.decode(latents).sample)
        assert torch.equal(vae.encode(video).latent_dist.mode(), latents)  # replayed after the decode's captures
    held = report(vae).graph_memory
    assert [size.size for size in held.sizes] == ["1x60x104 bfloat16 cuda:0", "1x480x832 bfloat16 cuda:0 encode"]
    assert report(vae).last_path == "graphs"
