"""Qwen-Image's encoder through the Wan family's encoder capture (`rewrite.models.wan.encoder_capture`): the
steps, eager and exported, give `_encode`'s value bit for bit, and the decoder's `lossless` patterns rewrite the
exported graphs without changing it (CPU, tiny config; images and a 5-frame clip)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from rewrite.models.qwenimage import runner as _runner  # noqa: F401  (registers the family's class names)
from rewrite.models.qwenimage.config import build_qwenimage
from rewrite.models.wan.encoder_capture import (WanEncoderChunk0Step, WanEncoderSteadyStep, capture_wan_encoder,
                                                stepped_encode)
from rewrite.pipeline import rewrite_graph


@functools.lru_cache(maxsize=None)
def _vae():
    return build_qwenimage("tiny")


def _images(batch: int, frames: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(batch, 3, frames, 32, 48, generator=torch.Generator().manual_seed(frames)).to(dtype)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("batch,frames", ((2, 1), (1, 5)))
def test_the_eager_steps_are_encode(dtype, batch, frames):
    vae = copy.deepcopy(_vae()).to(dtype)
    images = _images(batch, frames, dtype)
    with torch.no_grad():
        actual = stepped_encode(vae, images, WanEncoderChunk0Step(vae.encoder), WanEncoderSteadyStep(vae.encoder))
        assert torch.equal(actual, vae._encode(images))


def test_the_rewritten_lossless_graphs_are_encode():
    vae = _vae()
    graphs = capture_wan_encoder(vae.encoder, torch.float32, torch.device("cpu"))
    for graph in graphs:
        rewrite_graph(graph, "lossless")
        assert graph.matches.get("rms_norm_causal_conv3d", 0) + sum(
            count for name, count in graph.matches.items() if name.startswith("rms_norm_causal_conv3d[")) == 13
    chunk0, steady = (lambda x, *c, g=g: g(g.weights(vae.encoder), x, *(t for group in c for t in group))
                      for g in graphs)
    for batch, frames in ((2, 1), (1, 5)):
        images = _images(batch, frames)
        with torch.no_grad():
            assert torch.equal(stepped_encode(vae, images, chunk0, steady), vae._encode(images)), (batch, frames)
