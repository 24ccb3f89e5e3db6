"""An optimized module saved and loaded (pickle, torch.save, deepcopy, save_pretrained), and compiled on top.

A loaded module is optimized again at its pickled level on first use (graphs are never written); a copy
keeps its captured FX graphs; ``torch.compile`` of an optimized decode runs the decode as it is.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from rewrite import optimize, report
from rewrite.models.auk.capture import reference_decode
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import build_wan
from rewrite.runtime.runner import PendingRunner

MICRO = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                  resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))


def torch_round_trip(module):
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def pickle_round_trip(module):
    return pickle.loads(pickle.dumps(module))


@torch.no_grad()
@pytest.mark.parametrize("when", ["before a decode", "after a decode"])
def test_a_pickled_wan_model_loads_optimized_and_decodes_exactly(wan_pair, when):
    pair = wan_pair("wan2.1")
    z = pair.latents(1, 2, seed=7)
    expected = pair.reference.decode(z).sample
    if when == "before a decode":
        source, round_trip = optimize(build_wan("wan2.1", "tiny")), pickle_round_trip
    else:
        pair.optimized.decode(z)
        source, round_trip = pair.optimized, torch_round_trip
    loaded = round_trip(source)
    assert isinstance(loaded.__dict__["_rewrite_runner"], PendingRunner)  # no graphs were written
    assert loaded.decoder.__dict__["_rewrite_runner"] is loaded.__dict__["_rewrite_runner"]
    assert torch.equal(loaded.decode(z).sample, expected)
    summary = report(loaded)
    assert summary.level == "lossless" and summary.last_path == "graphs" and len(summary.graphs) == 2
    assert loaded.decoder.__dict__["_rewrite_runner"] is loaded.__dict__["_rewrite_runner"]  # one runner again


@torch.no_grad()
@pytest.mark.parametrize("round_trip", [pickle_round_trip, torch_round_trip])
def test_a_pickled_auk_model_loads_optimized_with_its_options(round_trip):
    torch.manual_seed(2)
    reference = AuKVAE(MICRO).eval()
    vae = optimize(copy.deepcopy(reference), "lossless", max_graphs=3)
    z = torch.randn(1, 25, MICRO.latent_dim, generator=torch.Generator().manual_seed(1))
    vae.decode(z)
    loaded = round_trip(vae)
    assert report(loaded).level == "lossless"  # report() restores the runner too
    assert loaded._rewrite_runner.options["max_graphs"] == 3
    assert torch.equal(loaded.decode(z), reference_decode(reference, z))
    assert report(loaded).last_path == "graphs"
    assert list(loaded.decode_tiles(z))[0][0] == 0


@torch.no_grad()
def test_after_optimize_off_the_model_keeps_its_own_decode_tiles():
    torch.manual_seed(2)
    vae = optimize(AuKVAE(MICRO).eval(), "lossless")
    assert "decode_tiles" in vae.__dict__
    optimize(vae, "off")
    z = torch.randn(1, 25, MICRO.latent_dim, generator=torch.Generator().manual_seed(1))
    (start, piece), = vae.decode_tiles(z)
    assert start == 0 and torch.equal(piece, vae.decode(z))


@torch.no_grad()
def test_save_pretrained_of_an_optimized_wan_model_writes_the_plain_weights(wan_pair, tmp_path):
    from diffusers import AutoencoderKLWan

    pair = wan_pair("wan2.1")
    pair.optimized.save_pretrained(tmp_path)
    loaded = AutoencoderKLWan.from_pretrained(tmp_path).eval()
    z = pair.latents(1, 2, seed=8)
    assert "_decode" not in loaded.__dict__ and torch.equal(loaded.decode(z).sample, pair.reference.decode(z).sample)


@torch.no_grad()
@pytest.mark.parametrize("model", ["wan", "auk"])
def test_torch_compile_of_an_optimized_decode_gives_the_same_answer(wan_pair, model):
    """Dynamo does not trace into the optimized decode (its graphs are already compiled): it runs as it is."""
    torch._dynamo.reset()
    if model == "wan":
        pair = wan_pair("wan2.1")
        z = pair.latents(1, 2, seed=9)
        compiled = torch.compile(pair.optimized.decode)
        out, expected = compiled(z).sample, pair.reference.decode(z).sample
        vae = pair.optimized
    else:
        torch.manual_seed(5)
        reference = AuKVAE(MICRO).eval()
        vae = optimize(copy.deepcopy(reference), "lossless")
        z = torch.randn(1, 25, MICRO.latent_dim, generator=torch.Generator().manual_seed(2))
        out, expected = torch.compile(vae.decode)(z), reference_decode(reference, z)
    assert torch.equal(out, expected) and report(vae).last_path == "graphs"
