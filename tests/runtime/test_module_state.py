"""Module state after capture: train mode, edits of what the decoder computes, parametrizations, and what a
fallback decode runs and reports. A captured graph must never serve a module it was not captured for."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch.nn.utils.parametrizations import weight_norm

from rewrite import optimize, report
from rewrite.models.auk.capture import reference_decode
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import wan_config
from rewrite.runtime.runner import MAX_RECAPTURES

MICRO = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                  resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))


def wan_latents(frames: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 4, frames, 4, 6, generator=torch.Generator().manual_seed(seed))


def wan_twins(**config):
    """A reference Wan 2.1 tiny VAE and an optimized one with the same weights."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    reference = AutoencoderKLWan(**wan_config("wan2.1", "tiny"), **config).eval()
    return reference, optimize(copy.deepcopy(reference))


@torch.no_grad()
def test_train_mode_with_active_dropout_takes_the_reference_path_and_eval_mode_the_graphs():
    reference, vae = wan_twins(dropout=0.5)
    z = wan_latents()
    vae.train()
    vae.decode(z)
    summary = report(vae)
    assert summary.last_path == "reference" and "train mode with active dropout" in summary.last_reason
    assert "dropout" in summary.last_reason and summary.graphs == []  # refused before any capture
    vae.eval()
    assert torch.equal(vae.decode(z).sample, reference.decode(z).sample)
    assert report(vae).last_path == "graphs"
    vae.train()  # captured in eval mode: the graphs must not serve train mode either
    vae.decode(z)
    assert report(vae).last_path == "reference"


@torch.no_grad()
def test_train_mode_without_active_dropout_is_served_by_the_graphs(wan_pair):
    pair = wan_pair("wan2.1")
    z = pair.latents(1, 2, seed=3)
    pair.reference.train(), pair.optimized.train()
    try:
        reference, optimized = pair.decode_both(z)
        assert torch.equal(optimized, reference) and report(pair.optimized).last_path == "graphs"
    finally:
        pair.reference.eval(), pair.optimized.eval()


@torch.no_grad()
def test_edits_of_what_the_decoder_computes_are_captured_again(caplog):
    reference, vae = wan_twins()
    z = wan_latents()
    assert torch.equal(vae.decode(z).sample, reference.decode(z).sample)
    edits = {
        "activation swapped": lambda m: setattr(m.decoder.up_blocks[0].resnets[0], "nonlinearity", torch.nn.GELU()),
        "norm scale": lambda m: setattr(m.decoder.norm_out, "scale", 2.0),
        "conv bias removed": lambda m: setattr(m.decoder.conv_out, "bias", None),
    }
    assert len(edits) == MAX_RECAPTURES
    for name, edit in edits.items():
        edit(reference), edit(vae)
        with caplog.at_level(logging.WARNING, logger="rewrite"):
            out = vae.decode(z).sample
        assert torch.equal(out, reference.decode(z).sample), name
        assert report(vae).last_path == "graphs", name
        assert "capturing again" in caplog.text, name
        caplog.clear()
    # one edit too many: the reference path serves it from now on, and says why
    for m in (reference, vae):
        m.decoder.conv_in.padding_mode = "reflect"
        m.decoder.conv_in._reversed_padding_repeated_twice = [0, 0, 0, 0, 0, 0]
    assert torch.equal(vae.decode(z).sample, reference.decode(z).sample)
    summary = report(vae)
    assert summary.last_path == "reference" and "padding_mode" in summary.last_reason


@torch.no_grad()
def test_a_weight_norm_parametrization_is_captured_through(caplog):
    reference, vae = wan_twins()
    z = wan_latents()
    vae.decode(z)
    for m in (reference, vae):
        weight_norm(m.decoder.conv_in)
    assert torch.equal(vae.decode(z).sample, reference.decode(z).sample)
    assert report(vae).last_path == "graphs"
    with torch.no_grad():  # the parametrized weight's inputs are graph weights, read at call time
        for m in (reference, vae):
            m.decoder.conv_in.parametrizations.weight.original0.mul_(0.5)
    assert torch.equal(vae.decode(z).sample, reference.decode(z).sample)


@torch.no_grad()
def test_auk_edits_are_captured_again_and_train_mode_is_served():
    torch.manual_seed(1)
    reference = AuKVAE(MICRO).eval()
    vae = optimize(copy.deepcopy(reference), "lossless")
    z = torch.randn(1, 30, MICRO.latent_dim, generator=torch.Generator().manual_seed(2))
    assert torch.equal(vae.decode(z), reference_decode(reference, z))
    for m in (reference, vae):
        m.decoder.activation_post.act.logscale = False
    assert torch.equal(vae.decode(z), reference_decode(reference, z)) and report(vae).last_path == "graphs"
    vae.train(), reference.train()  # the AuK decoder has no mode-dependent module
    assert torch.equal(vae.decode(z), reference_decode(reference, z)) and report(vae).last_path == "graphs"


@torch.no_grad()
def test_a_fallback_decode_runs_post_quant_conv_once_and_is_reported_once():
    reference, vae = wan_twins()  # the hook below refuses the graphs before any capture
    calls = []
    handle = vae.decoder.conv_in.register_forward_hook(lambda *args: calls.append("conv_in"))
    quant = vae.post_quant_conv.register_forward_hook(lambda *args: calls.append("post_quant_conv"))
    before = sum(report(vae).fallbacks.values())
    try:
        z = wan_latents(frames=3, seed=4)
        out = vae.decode(z).sample
    finally:
        handle.remove(), quant.remove()
    assert torch.equal(out, reference.decode(z).sample)
    assert calls.count("post_quant_conv") == 1 and calls.count("conv_in") == 3  # one per latent frame
    summary = report(vae)
    assert summary.last_path == "reference" and "hooks" in summary.last_reason
    assert sum(summary.fallbacks.values()) == before + 1  # one decode, one fallback


def test_parameters_requiring_grad_are_named_as_the_reason(caplog):
    _, vae = wan_twins()  # refused before any capture
    assert torch.is_grad_enabled() and next(vae.parameters()).requires_grad
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        vae.decode(wan_latents(seed=5))
    assert "for the graphs, decode under torch.no_grad()" in caplog.text
    reason = report(vae).last_reason
    assert "decoder parameters require grad" in reason and "torch.no_grad()" in reason
    assert "requires_grad_(False)" in reason


@pytest.mark.parametrize("edit", ["tensor attribute"])
@torch.no_grad()
def test_a_tensor_held_as_a_plain_attribute_takes_the_reference_path(edit):
    reference, vae = wan_twins()
    z = wan_latents()
    vae.decode(z)
    for m in (reference, vae):
        conv = m.decoder.conv_out
        weight = conv.weight * 0.5
        del conv.weight
        conv.weight = weight
    assert torch.equal(vae.decode(z).sample, reference.decode(z).sample)
    summary = report(vae)
    assert summary.last_path == "reference" and "decoder.conv_out.weight" in summary.last_reason
