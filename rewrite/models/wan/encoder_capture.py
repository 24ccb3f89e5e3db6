"""Capture the diffusers Wan 2.1 / 2.2 encoder (`AutoencoderKLWan.encoder`) as two step graphs with explicit
caches, as `rewrite.models.wan.capture` does for the decoder (issue 39: the capture; no runner serves
`vae.encode` yet).

`AutoencoderKLWan._encode` patchifies the video (Wan 2.2), runs the encoder on its first frame, then on 4 frames
a chunk, with a Python list of caches it mutates in place, and applies `quant_conv` to the chunks' outputs
joined in time. Its cache slots: one per causal conv (the last 2 frames of the conv's input, 1 after the first
chunk) and one per downsampler's `time_conv` (the last frame of its input; the first chunk stores its whole
1-frame input and skips the conv). The steps:

  chunk0(x)              -> (out, *caches)   the first frame
  steady(x, *caches)     -> (out, *caches)   every later chunk of 4 frames

Chunk 0 returns its caches in *steady form*: a causal conv's 1-frame cache with a zero frame before it (the
conv would pad that zero frame itself, and the next cache reads only the last frame: the same values), a
`time_conv` cache as it is. So one steady graph serves every later chunk and every conv sees bit-identical
inputs: `stepped_encode` over the steps is `torch.equal` to `_encode` (tests/models/wan/test_encoder_capture.py).

Preconditions: the encoder of an `AutoencoderKLWan` (or of a family registered with
`rewrite.models.wan.capture.add_decoder_family`, whose encoder classes carry the same prefix); a video of
``1 + 4k`` frames, patchified first where the model has a ``patch_size``.
"""

from __future__ import annotations

import torch
from torch import nn

from rewrite.capture.export import CapturedGraph, concrete_shape, export_step, tracing_copy
from rewrite.models.wan.capture import cache_slot_count, family_class

#: input dims that stay symbolic in the exported graphs: batch, height, width (frames: 1 or 4 per step)
DYNAMIC_DIMS = (0, 3, 4)
#: example video size for the export (no real compute happens; distinct values avoid accidental equalities)
EXAMPLE_BATCH, EXAMPLE_HEIGHT, EXAMPLE_WIDTH = 2, 32, 48
#: frames of the first step and of every later one (`_encode`'s chunks)
FIRST_FRAMES, STEP_FRAMES = 1, 4


def _time_downsamplers(encoder: nn.Module) -> list[nn.Module]:
    resample = family_class(encoder, "Resample")
    return [m for m in encoder.modules() if isinstance(m, resample) and m.mode == "downsample3d"]


def _forward(encoder: nn.Module, x: torch.Tensor, slots: list, index: list[int]) -> torch.Tensor:
    """The encoder class's own forward (not a caller's instance forward) over `slots`."""
    return family_class(encoder, "Encoder3d").forward(encoder, x, feat_cache=slots, feat_idx=index)


class WanEncoderChunk0Step(nn.Module):
    """``x [B, C, 1, H, W] -> (out, *caches)``, the caches in steady form (module docstring)."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor):
        slots: list = [None] * cache_slot_count(self.encoder)
        index = [0]
        time_slots: list[int] = []  # the slot a time_conv keeps: the cache index when its downsampler starts

        def note_slot(_module, args, kwargs):  # called as (x, feat_cache, feat_idx), by keyword (Wan) or not (Qwen)
            time_slots.append((kwargs["feat_idx"] if "feat_idx" in kwargs else args[2])[0])

        hooks = [m.register_forward_pre_hook(note_slot, with_kwargs=True) for m in _time_downsamplers(self.encoder)]
        try:
            out = _forward(self.encoder, x, slots, index)
        finally:
            for hook in hooks:
                hook.remove()
        caches = []
        for i, slot in enumerate(slots[: index[0]]):
            if i not in time_slots and slot.shape[2] == 1:
                slot = torch.cat([torch.zeros_like(slot), slot], 2)
            caches.append(slot)
        return (out, *caches)


class WanEncoderSteadyStep(nn.Module):
    """``(x [B, C, 4, H, W], caches) -> (out, *caches)``."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor, caches: list[torch.Tensor]):
        slots = list(caches)
        index = [0]
        out = _forward(self.encoder, x, slots, index)
        if index[0] != len(caches):
            raise RuntimeError(f"the steady step used {index[0]} cache slots, chunk 0 returned {len(caches)}")
        return (out, *slots[: index[0]])


def check_frames(frames: int) -> None:
    """`_encode` runs ``1 + 4k`` frames; the steps serve exactly those."""
    if frames < 1 or (frames - 1) % STEP_FRAMES:
        raise ValueError(f"expected 1 + 4k frames (1, 5, 9, ...), got {frames}")


def stepped_encode(vae: nn.Module, video: torch.Tensor, chunk0, steady) -> torch.Tensor:
    """`_encode(video)` computed by the two steps (callables as the step modules are, e.g. their exported
    graphs bound to weights): patchify where the model has a ``patch_size``, the first frame, the chunks of 4,
    `quant_conv` over the outputs joined in time. ``[B, 2 * z_dim, T', H', W']``, the value `_encode` returns."""
    check_frames(video.shape[2])
    if getattr(vae.config, "patch_size", None) is not None:  # Wan 2.2; Qwen-Image's config has no such key
        from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

        video = patchify(video, patch_size=vae.config.patch_size)
    out, *caches = chunk0(video[:, :, :FIRST_FRAMES])
    outs = [out]
    for start in range(FIRST_FRAMES, video.shape[2], STEP_FRAMES):
        out, *caches = steady(video[:, :, start: start + STEP_FRAMES], caches)
        outs.append(out)
    return vae.quant_conv(torch.cat(outs, 2))


def capture_wan_encoder(encoder: nn.Module, dtype: torch.dtype,
                        device: torch.device) -> tuple[CapturedGraph, CapturedGraph]:
    """Export the chunk-0 and steady step graphs of a Wan-family encoder for one dtype and device, batch, height
    and width symbolic. The graphs take the (patchified) video's frames; their weights are read from the encoder
    (`CapturedGraph.weights(encoder)`). What is traced is a `tracing_copy` (eval mode, same tensors): the live
    encoder is never touched."""
    traced = tracing_copy(encoder)
    channels = traced.conv_in.in_channels
    x = torch.zeros(EXAMPLE_BATCH, channels, FIRST_FRAMES, EXAMPLE_HEIGHT, EXAMPLE_WIDTH, dtype=dtype, device=device)
    chunk0 = export_step("encode_chunk0", WanEncoderChunk0Step(traced), (x,), dynamic_dims=DYNAMIC_DIMS,
                         strip_prefix="encoder.")
    output = next(n for n in chunk0.graph_module.graph.nodes if n.op == "output")
    caches = [torch.zeros(concrete_shape(n.meta["val"]), dtype=n.meta["val"].dtype, device=device)
              for n in output.args[0][1:]]
    x4 = torch.zeros(EXAMPLE_BATCH, channels, STEP_FRAMES, EXAMPLE_HEIGHT, EXAMPLE_WIDTH, dtype=dtype, device=device)
    steady = export_step("encode_steady", WanEncoderSteadyStep(traced), (x4, caches), dynamic_dims=DYNAMIC_DIMS,
                         strip_prefix="encoder.")
    return chunk0, steady
