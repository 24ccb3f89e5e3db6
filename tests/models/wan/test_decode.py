"""Captured Wan decoders reproduce diffusers bit for bit (torch.equal), on CPU, for Wan 2.1 and 2.2."""

from __future__ import annotations

import pytest
import torch

from rewrite import report
from rewrite.models.wan.runner import WanRunner
from tests import quick
from tests.conftest import WanPair

VERSIONS = ("wan2.1", "wan2.2")
DTYPES = (torch.float32, torch.bfloat16)


@pytest.mark.parametrize("version,dtype,batch,frames", quick.product(
    {f"{v}-{d}": (v, d) for v in VERSIONS for d in DTYPES},
    {f"b{b}-f{f}": (b, f) for b in (1, 2) for f in (1, 2, 5)}))
def test_decode_is_bit_identical(wan_pair, version, dtype, batch, frames):
    pair = wan_pair(version, dtype)
    reference, optimized = pair.decode_both(pair.latents(batch, frames, seed=frames * 10 + batch))
    assert report(pair.optimized).last_path == "graphs", report(pair.optimized)
    assert optimized.shape == reference.shape
    assert torch.equal(optimized, reference)


@pytest.mark.parametrize("version", VERSIONS)
def test_resolutions_without_graphs_of_their_own_share_one_symbolic_capture(wan_pair, version, monkeypatch):
    """Past `WanRunner.STATIC_SIZES` (0 here) every new resolution is served by one capture with symbolic sizes
    (sizes the shared pair already has graphs for keep them; tests/models/wan/test_graph_keys.py has the whole
    rule)."""
    monkeypatch.setattr(WanRunner, "STATIC_SIZES", 0)
    pair = wan_pair(version, torch.float32)
    for height, width in ((4, 6), (6, 4), (2, 3), (3, 7)):
        reference, optimized = pair.decode_both(pair.latents(1, 3, height, width))
        assert torch.equal(optimized, reference), (height, width)
    keys = [key for key in pair.optimized._rewrite_runner.graphs.values if key[0] == torch.float32]
    assert [key for key in keys if key[2] is None] == [(torch.float32, torch.device("cpu"), None)]


@pytest.mark.parametrize("version", VERSIONS)
def test_return_dict_false(wan_pair, version):
    pair = wan_pair(version, torch.float32)
    z = pair.latents(1, 2)
    with torch.no_grad():
        (optimized,) = pair.optimized.decode(z, return_dict=False)
        reference = pair.reference.decode(z).sample
    assert torch.equal(optimized, reference)


@pytest.mark.parametrize("version", [VERSIONS[0], pytest.param(VERSIONS[1], marks=quick.slow)])
def test_tiling_with_uneven_edge_tiles(version):
    pair = WanPair(version, torch.float32)
    ratio = pair.reference.spatial_compression_ratio
    # tiles of 4 latent rows/cols every 3: a 7x8 latent leaves edge tiles 1 and 2 wide
    for vae in (pair.reference, pair.optimized):
        vae.enable_tiling(tile_sample_min_height=4 * ratio, tile_sample_min_width=4 * ratio,
                          tile_sample_stride_height=3 * ratio, tile_sample_stride_width=3 * ratio)
    reference, optimized = pair.decode_both(pair.latents(1, 3, 7, 8))
    assert report(pair.optimized).last_path == "graphs"
    assert torch.equal(optimized, reference)


@pytest.mark.parametrize("version", VERSIONS)
def test_slicing(version):
    pair = WanPair(version, torch.float32)
    for vae in (pair.reference, pair.optimized):
        vae.enable_slicing()
    reference, optimized = pair.decode_both(pair.latents(2, 2))
    assert torch.equal(optimized, reference)


def test_state_dict_and_parameters_unchanged():
    from rewrite import optimize
    from rewrite.models.wan.config import build_wan

    vae = build_wan("wan2.1", "tiny")
    keys_before = list(vae.state_dict().keys())
    params_before = dict(vae.named_parameters())
    optimize(vae)
    with torch.no_grad():
        vae.decode(torch.randn(1, 4, 2, 4, 4))
    assert list(vae.state_dict().keys()) == keys_before
    params_after = dict(vae.named_parameters())
    assert params_after.keys() == params_before.keys()
    assert all(params_after[name] is param for name, param in params_before.items())


@pytest.mark.parametrize("assign", (False, True))
def test_weight_reload_after_capture_takes_effect(assign):
    from rewrite.models.wan.config import build_wan

    pair = WanPair("wan2.1", torch.float32)
    z = pair.latents(1, 2)
    pair.decode_both(z)  # captures
    new_weights = build_wan("wan2.1", "tiny", seed=7).state_dict()
    pair.reference.load_state_dict(new_weights)
    pair.optimized.load_state_dict(new_weights, assign=assign)
    reference, optimized = pair.decode_both(z)
    assert report(pair.optimized).last_path == "graphs"
    assert torch.equal(optimized, reference)
