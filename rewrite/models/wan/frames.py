"""The Wan frame loop's pieces that the whole-clip decode (`rewrite.models.wan.runner`) and the streamed decode
(`rewrite.models.wan.stream`) share: one chunk through the graphs over diffusers' cache list, where a latent
frame's frames go in the video, and the video's finish as diffusers' `_decode` gives it."""

from __future__ import annotations

import torch
from torch import nn

#: why a chunk after the first runs the reference: the reference decoded the first, its caches are not steady
CHUNK1_FORM = "decoder cache is in the reference's chunk-1 form"


def temporal_factor(decoder: nn.Module) -> int:
    """Output frames per latent frame after the first (4 for Wan 2.1 and 2.2: two temporal upsamplers)."""
    return 2 ** sum(bool(t) for t in decoder.temperal_upsample)


def store_frames(video: torch.Tensor | None, y: torch.Tensor, i: int, frames: int, temporal: int) -> torch.Tensor:
    """Latent frame i's decoded frames `y` into the video of a `frames`-latent-frame clip (made at i = 0, for
    the whole clip: one allocation, no growing `cat`); returns the video."""
    if video is None:
        video = y.new_empty((y.shape[0], y.shape[1], 1 + (frames - 1) * temporal, *y.shape[3:]))
    start = 0 if i == 0 else 1 + (i - 1) * temporal
    video[:, :, start : start + y.shape[2]] = y
    return video


def finish_video(vae: nn.Module, video: torch.Tensor) -> torch.Tensor:
    """The decoder's output as `_decode` returns it: unpatchified (Wan 2.2), clamped to [-1, 1] in place."""
    if getattr(vae.config, "patch_size", None) is not None:  # a config without the key (Qwen-Image's): none
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        video = unpatchify(video, patch_size=vae.config.patch_size)
    return video.clamp_(min=-1.0, max=1.0)


def decodes_tiled(vae: nn.Module, height: int, width: int) -> bool:
    """Whether diffusers' `_decode` hands latents of this size to `tiled_decode` (`enable_tiling()`)."""
    ratio = vae.spatial_compression_ratio
    return vae.use_tiling and (width > vae.tile_sample_min_width // ratio or height > vae.tile_sample_min_height // ratio)


def steady_form(slots) -> bool:
    """Whether diffusers' cache slots hold steady-form caches (2 frames each), which the steady graph takes."""
    return all(isinstance(slot, torch.Tensor) and slot.shape[2] == 2 for slot in slots)


def run_graph_chunk(graphs, decoder: nn.Module, x: torch.Tensor, feat_cache: list, first_chunk: bool):
    """One chunk through the eager graph modules over diffusers' cache list, updated in place: chunk 0 when
    `first_chunk` or the slots are empty, the steady graph when they are in steady form. Returns (y, slots
    used), or None, changing nothing, when the slots are in the reference's chunk-1 form."""
    chunk0, steady = graphs
    slots = len(steady.user_input_names) - 1  # the user inputs are x and the caches
    current = feat_cache[:slots]
    if first_chunk or all(slot is None for slot in current):
        y, *caches = chunk0(chunk0.weights(decoder), x)
    elif steady_form(current):
        y, *caches = steady(steady.weights(decoder), x, *current)
    else:
        return None
    feat_cache[:slots] = caches
    return y, slots
