"""optimize()/report() behaviour: bad input, fallbacks with their reasons, idempotence, level off."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from rewrite import LEVELS, optimize, report
from rewrite.models.wan.config import build_wan
from tests.conftest import WanPair


def test_unsupported_module_names_supported_types():
    with pytest.raises(TypeError, match="AutoencoderKLWan"):
        optimize(nn.Linear(2, 2))


def test_unknown_level_lists_levels():
    with pytest.raises(ValueError) as info:
        optimize(build_wan("wan2.1", "tiny"), level="fast")
    assert all(level in str(info.value) for level in LEVELS)


@pytest.mark.parametrize(
    "shape", [(1, 4, 2, 4), (1, 5, 2, 4, 4), (1, 4, 0, 4, 4)], ids=("rank4", "channels", "no-frames")
)
def test_bad_latents_raise_value_error_naming_the_shape(wan_pair, shape):
    vae = wan_pair("wan2.1").optimized
    with pytest.raises(ValueError, match=r"\[batch, 4, frames, height, width\]|at least one"):
        with torch.no_grad():
            vae.decode(torch.randn(shape))


def test_autograd_enabled_takes_reference_path_and_says_why(wan_pair, caplog):
    pair = wan_pair("wan2.1")
    z = pair.latents(1, 2)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        optimized = pair.optimized.decode(z).sample
    reference = pair.reference.decode(z).sample
    summary = report(pair.optimized)
    assert summary.last_path == "reference" and "autograd" in summary.last_reason
    assert any("autograd" in reason for reason in summary.fallbacks)
    assert "autograd" in caplog.text
    assert torch.equal(optimized.detach(), reference.detach())
    assert optimized.requires_grad  # the reference path kept autograd working


def test_forward_hook_inside_decoder_takes_reference_path():
    pair = WanPair("wan2.1", torch.float32)
    calls = []
    handle = pair.optimized.decoder.mid_block.register_forward_hook(lambda *_: calls.append(1))
    reference, optimized = pair.decode_both(pair.latents(1, 2))
    summary = report(pair.optimized)
    assert calls, "the user's hook must run"
    assert summary.last_path == "reference" and "decoder.mid_block" in summary.last_reason
    assert torch.equal(optimized, reference)
    handle.remove()
    pair.decode_both(pair.latents(1, 2))
    assert report(pair.optimized).last_path == "graphs"


def test_instance_forward_wrapper_inside_decoder_takes_reference_path():
    pair = WanPair("wan2.1", torch.float32)
    block = pair.optimized.decoder.up_blocks[0]
    original = block.forward
    block.forward = lambda *args, **kwargs: original(*args, **kwargs)
    reference, optimized = pair.decode_both(pair.latents(1, 2))
    summary = report(pair.optimized)
    assert summary.last_path == "reference" and "decoder.up_blocks.0 (instance forward)" in summary.last_reason
    assert torch.equal(optimized, reference)


def test_optimize_twice_is_safe_and_keeps_graphs(wan_pair):
    pair = wan_pair("wan2.1")
    pair.decode_both(pair.latents(1, 2))
    graphs_before = report(pair.optimized).graphs
    assert optimize(pair.optimized) is pair.optimized
    reference, optimized = pair.decode_both(pair.latents(1, 2))
    assert torch.equal(optimized, reference)
    assert len(report(pair.optimized).graphs) == len(graphs_before)


def test_level_off_leaves_module_as_it_was():
    vae = build_wan("wan2.1", "tiny")
    attributes = set(vae.__dict__)
    decoder_attributes = set(vae.decoder.__dict__)
    optimize(vae)
    optimize(vae, level="off")
    assert set(vae.__dict__) == attributes and set(vae.decoder.__dict__) == decoder_attributes
    assert report(vae).level == "off"


def test_report_lists_graphs_with_nodes_capture_time_and_dtype(wan_pair):
    pair = wan_pair("wan2.1")
    pair.decode_both(pair.latents(1, 2))
    summary = report(pair.optimized)
    assert summary.level == "lossless"
    by_name = {g.name: g for g in summary.graphs if g.dtype == "torch.float32"}
    assert set(by_name) == {"chunk0", "steady"}
    for graph in by_name.values():
        assert graph.nodes > 100 and graph.capture_seconds > 0 and graph.device == "cpu"
        assert graph.passes[0] == "canonicalize"
    assert "steady" in str(summary)


def test_cudnn_disabled_is_a_fallback_reason_on_cuda_only():
    from rewrite.runtime import guards

    with torch.backends.cudnn.flags(enabled=False):
        assert "cuDNN is disabled" in guards.cudnn_reason(torch.device("cuda", 0))
        assert guards.cudnn_reason(torch.device("cpu")) is None
    with torch.backends.cudnn.flags(enabled=True):
        assert guards.cudnn_reason(torch.device("cuda", 0)) is None
