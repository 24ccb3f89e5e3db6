"""The Wan encoder as two step graphs (`rewrite.models.wan.encoder_capture`, issue 39's capture): the steps, eager
and exported, give `_encode`'s value bit for bit, and the decoder's `lossless` patterns rewrite the exported
graphs without changing it. CPU, tiny configs with perturbed norms (`build_wan`).

The exported graphs run in fp32 only: their eager steps are checked in fp32 and bf16 (a bf16 CPU conv rounds the
same way in both, since the steps call the encoder's own modules), and a rewritten graph's ops are the decoder's,
whose dtype coverage is tested with the decoder.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from rewrite.models.wan.config import build_wan
from rewrite.models.wan.encoder_capture import (WanEncoderChunk0Step, WanEncoderSteadyStep, cache_slot_count,
                                                capture_wan_encoder, check_frames, stepped_encode)
from rewrite.pipeline import rewrite_graph

VERSIONS = ("wan2.1", "wan2.2")


@functools.lru_cache(maxsize=None)
def _vae(version: str):
    return build_wan(version, "tiny")


@functools.lru_cache(maxsize=None)
def _graphs(version: str, level: str):
    """The exported step graphs (fp32, CPU), rewritten at `level` (``off``: as exported)."""
    graphs = capture_wan_encoder(_vae(version).encoder, torch.float32, torch.device("cpu"))
    if level != "off":
        graphs = tuple(copy.deepcopy(g) for g in graphs)
        for graph in graphs:
            rewrite_graph(graph, level)
    return graphs


def _video(version: str, batch: int, frames: int, height: int, width: int, dtype=torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(batch * 100 + frames)
    return torch.randn(batch, 3, frames, height, width, generator=generator).to(dtype)


def _reference(vae, video: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return vae._encode(video)


def _graph_encode(vae, video: torch.Tensor, chunk0, steady) -> torch.Tensor:
    def step(graph):
        return lambda x, *caches: graph(graph.weights(vae.encoder), x, *(c for group in caches for c in group))

    with torch.no_grad():
        return stepped_encode(vae, video, step(chunk0), step(steady))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("batch,frames,height,width", ((2, 9, 32, 48), (1, 1, 32, 48), (1, 5, 48, 80)))
def test_the_eager_steps_are_encode(version, dtype, batch, frames, height, width):
    vae = copy.deepcopy(_vae(version)).to(dtype)
    video = _video(version, batch, frames, height, width, dtype)
    with torch.no_grad():
        actual = stepped_encode(vae, video, WanEncoderChunk0Step(vae.encoder), WanEncoderSteadyStep(vae.encoder))
    assert torch.equal(actual, _reference(vae, video))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("level", ("off", "lossless"))
def test_the_exported_graphs_are_encode(version, level):
    vae = _vae(version)
    chunk0, steady = _graphs(version, level)
    for batch, frames, height, width in ((2, 9, 32, 48), (1, 5, 64, 96)):
        video = _video(version, batch, frames, height, width)
        assert torch.equal(_graph_encode(vae, video, chunk0, steady), _reference(vae, video)), (batch, frames)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_decoders_lossless_patterns_match_the_encoders_blocks(version):
    """Structural goldens of the tiny encoders' steps: the residual blocks' 13 norm + conv pairs (6 with the
    residual in the conv's epilogue), the 14 causal conv inputs and the shortcut conv match as in the decoder.
    Left for the encoder's own patterns: the downsamplers' pad + stride-2 conv, `time_conv` (its cache slice
    starts at -1, which `causal_conv_input` declines), the middle attention; on the CPU the deferred-bias
    patterns decline (a CPU conv may fold its bias into the sum)."""
    for graph in _graphs(version, "lossless"):
        families: dict[str, int] = {}
        for name, count in graph.matches.items():
            families[name.split("[", 1)[0]] = families.get(name.split("[", 1)[0], 0) + count
        assert (families.get("rms_norm_causal_conv3d"), families.get("causal_conv_input"), families.get("conv3d_residual"),
                families.get("pointwise_conv3d")) == (13, 14, 6, 1), (graph.name, graph.matches)


@pytest.mark.parametrize("version", VERSIONS)
def test_chunk0_returns_a_cache_for_each_slot_diffusers_fills(version):
    vae = _vae(version)
    video = _video(version, 1, 1, 32, 48)
    if vae.config.patch_size is not None:
        from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

        video = patchify(video, patch_size=vae.config.patch_size)
    with torch.no_grad():
        out, *caches = WanEncoderChunk0Step(vae.encoder)(video)
        vae.clear_cache()
        vae.encoder(video, feat_cache=vae._enc_feat_map, feat_idx=vae._enc_conv_idx)
    filled = [slot for slot in vae._enc_feat_map if slot is not None]
    vae.clear_cache()
    assert len(vae._enc_feat_map) == cache_slot_count(vae.encoder)
    assert len(caches) == len(filled) and all(c.shape[2] in (1, 2) for c in caches)


@pytest.mark.parametrize("frames", (0, 2, 4, 8))
def test_frame_counts_other_than_one_plus_four_k_are_refused(frames):
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        check_frames(frames)


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_full_size_encoders_rewritten_graphs_are_encode(version):
    """The full-size encoders (random init, perturbed norms): 21 norm + conv pairs per step match, and the
    `lossless` graphs give `_encode`'s value bit for bit (fp32, CPU, a small 5-frame video)."""
    vae = build_wan(version, "full")
    chunk0, steady = capture_wan_encoder(vae.encoder, torch.float32, torch.device("cpu"))
    for graph in (chunk0, steady):
        rewrite_graph(graph, "lossless")
        assert sum(n for name, n in graph.matches.items() if name.split("[", 1)[0] == "rms_norm_causal_conv3d") == 21
    video = _video(version, 1, 5, 64, 96)
    assert torch.equal(_graph_encode(vae, video, chunk0, steady), _reference(vae, video))
