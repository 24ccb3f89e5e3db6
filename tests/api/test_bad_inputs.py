"""Bad input to the API gets a clear error naming what was expected, before any device or capture work."""

from __future__ import annotations

import copy

import pytest
import torch

from rewrite import optimize, report, warmup
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import build_wan

MICRO = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                  resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))


@pytest.fixture(scope="module")
def micro_vae():
    torch.manual_seed(0)
    return optimize(AuKVAE(MICRO).eval(), "lossless")


@pytest.mark.parametrize("entry", [report, warmup])
def test_report_and_warmup_name_what_they_expected_for_a_non_module(entry):
    with pytest.raises(TypeError, match="expects .*module.*got int"):
        entry(42)


def test_an_unknown_option_is_refused_at_level_off_too():
    with pytest.raises(TypeError, match="bogus"):
        optimize(build_wan("wan2.1", "tiny"), "off", bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        optimize(AuKVAE(MICRO), "off", bogus=1)
    with pytest.raises(ValueError, match="max_graphs"):
        optimize(AuKVAE(MICRO), "off", max_graphs=0)


@pytest.mark.parametrize("shapes, error, message", [
    (5, TypeError, "got 5"),
    ((60, 104), TypeError, r"flat pair \(60, 104\).*did you mean \[\(60, 104\)\]"),
    ("60x104", TypeError, "got '60x104'"),
    ([(60, 0)], ValueError, r"entry \(60, 0\)"),
    ([(60, 104.0)], ValueError, "entry"),
    ([60, 104, 12], ValueError, "entry 60"),
])
def test_wan_warmup_refuses_malformed_shapes(wan_pair, shapes, error, message):
    with pytest.raises(error, match=message):
        warmup(wan_pair("wan2.1").optimized, shapes=shapes)


def test_wan_warmup_without_shapes_captures_the_step_graphs_and_says_so(wan_pair):
    vae = wan_pair("wan2.1").optimized
    result = warmup(vae)
    assert result.shapes == [] and "no shapes given" in result.note and "shapes=[(latent_height" in result.note
    symbolic = [key for key in vae._rewrite_runner.graphs.values if key[2] is None]  # (dtype, device, None)
    assert len(symbolic) == 1 and len(report(vae).graphs) >= 2
    assert warmup(vae, shapes=None).note == result.note


def test_wan_warmup_with_shapes_says_what_it_captured(wan_pair):
    result = warmup(wan_pair("wan2.1").optimized, shapes=[(4, 6)])
    assert result.shapes == [(1, 4, 6)] and result.note is None and result.seconds >= 0


@pytest.mark.parametrize("frames, error, message", [
    (-3, TypeError, r"got -3 \(did you mean \[-3\]\?\)"),
    (64, TypeError, r"did you mean \[64\]"),
    ("64", TypeError, "got '64'"),
    ([0], ValueError, "entry 0"),
    ([-1], ValueError, "entry -1"),
    ([2.5], ValueError, "entry 2.5"),
    ([True], ValueError, "entry True"),
])
def test_auk_warmup_refuses_malformed_frames_before_any_device_check(micro_vae, frames, error, message):
    with pytest.raises(error, match=message):
        warmup(micro_vae, frames=frames)


def test_auk_warmup_on_cpu_says_it_captured_no_cuda_graphs(micro_vae):
    result = warmup(copy.deepcopy(micro_vae), frames=[64])
    assert result.shapes == [] and "no CUDA graphs on cpu" in result.note
