"""The encode side of an optimized Wan-family VAE: `vae._encode` through the encoder's step graphs.

`WanRunner.install` sets `vae._encode` to `optimized_encode`, which computes what diffusers' `_encode` computes
(patchify where the model has a ``patch_size``, the encoder on the first frame and then on chunks of 4 frames
over its caches, `quant_conv` over the chunks' outputs joined in time) from the step graphs of
`rewrite.models.wan.encoder_capture`, rewritten at the module's level by the decoder's passes and patterns. On
CUDA the steps replay CUDA graphs per (batch, height, width, dtype): the decoder's `CudaGraphSteps`, in the same
`GraphMemory` as the decoder's sizes (one pool, one cache block, one budget per module and device); elsewhere
the graph modules run eagerly with the caches handed from step to step. `encode()` (its hooks, slicing) and
`DiagonalGaussianDistribution` stay diffusers' own: only `_encode`'s value is computed here.

Exactness: at ``lossless`` the result is `torch.equal` to diffusers' `_encode` (the steps are, and `quant_conv`
is the module itself); at ``channels_last`` the encoder's norm + conv pairs take the level's kernels, within
its contract. Frames: `_encode` reads frames ``0 .. 4k`` of a video of ``1 + 4k + r`` frames and never the last
``r``, so those are dropped here the same way.

Served by diffusers' own `_encode` instead, with the reason logged and in `report()`: a tiled encode
(`enable_tiling()` and a video above the tile size: diffusers' `tiled_encode`), and whatever the guards refuse
(autograd, autocast, hooks, train mode, mixed dtypes, a failed capture), or out of memory twice on the graphs.
A video that is not ``[batch, channels, frames, height, width]`` with the encoder's channel count, at least one
frame and the weights' dtype gets a ValueError saying what was expected.
"""

from __future__ import annotations

import torch
from torch import nn

from rewrite.models.wan.encoder_capture import FIRST_FRAMES, STEP_FRAMES, capture_wan_encoder
from rewrite.models.wan.steps import EagerSteps
from rewrite.models.wan.warmup_sizes import frame_counts, latent_sizes
from rewrite.runtime import guards
from rewrite.runtime.locks import CAPTURE_GATE
from rewrite.runtime.runner import OUT_OF_MEMORY_REASON, installed_runner

#: the last part of an encoder's graph keys: the step graphs' (dtype, device, None, ENCODE) and the CUDA graphs'
ENCODE = "encode"
#: why a tiled encode runs diffusers' code
TILED_ENCODE = "tiled encode (enable_tiling() and a video above the tile size) runs diffusers' tiled_encode"


def video_channels(vae: nn.Module) -> int:
    """The channels of the video `encode` takes (before a patchify folds patches into channels)."""
    patch = getattr(vae.config, "patch_size", None) or 1
    return vae.encoder.conv_in.in_channels // (patch * patch)


def check_video(vae: nn.Module, x: torch.Tensor) -> None:
    """A ValueError for a video diffusers' encode cannot take: not [batch, channels, frames, height, width] with
    the encoder's channels, empty, or of another dtype than the encoder's weights."""
    channels = video_channels(vae)
    if not isinstance(x, torch.Tensor) or x.dim() != 5 or x.shape[1] != channels:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"the video to encode must be [batch, {channels}, frames, height, width]; got {got}")
    if min(x.shape[0], x.shape[2], x.shape[3], x.shape[4]) < 1:
        raise ValueError(f"the video to encode must have at least one batch item, frame, row and column; "
                         f"got {tuple(x.shape)}")
    expected = guards.refused_input_dtype(vae.encoder.conv_in, x)
    if expected is not None:
        raise ValueError(f"the video to encode must be {expected}, the dtype of the VAE's weights (diffusers' encoder "
                         f"feeds it to conv_in, which takes no other); got {x.dtype} (cast it: x.to({expected}))")


def encodes_tiled(vae: nn.Module, height: int, width: int) -> bool:
    """Whether diffusers' `_encode` hands a video of this size to `tiled_encode` (`enable_tiling()`)."""
    return vae.use_tiling and (width > vae.tile_sample_min_width or height > vae.tile_sample_min_height)


def graph_key(x: torch.Tensor) -> tuple:
    """The key of the encoder's step graphs for input `x`: one pair per dtype and device, sizes symbolic."""
    return (x.dtype, x.device, None, ENCODE)


def encoder_graphs_for(runner, encoder: nn.Module, key: tuple, listing=None):
    """The encoder's (chunk0, steady) graphs of `key` (`graph_key`), captured and rewritten on first use and
    again after the encoder changed (`DecoderRunner.captured`); None when the capture failed."""
    dtype, device = key[0], key[1]

    def capture():
        return runner.capture_graphs(lambda: capture_wan_encoder(encoder, dtype, device), key=key, model=runner.vae,
                                     root=encoder, names=("encode_chunk0", "encode_steady"), dtype=dtype,
                                     device=device)

    listing = list(encoder.named_modules(prefix="encoder")) if listing is None else listing
    return runner.captured(key, listing, capture, f"the encoder, {dtype} on {device}")


def encode_reason(runner, vae: nn.Module, x: torch.Tensor) -> str | None:
    """Why the (patchified) video `x` cannot be encoded through the graphs, or None (captures on first use)."""
    reason = guards.autograd_reason(vae, x, call="encode") or guards.autocast_reason(x.device)
    if reason is None:
        reason = runner.checked_region(vae.encoder, "encoder", x, graph_key(x),
                                       lambda region, key, listing: encoder_graphs_for(runner, region, key, listing))
    if reason is None:
        reason = guards.uniform_parameters_reason(vae.quant_conv, x, "quant_conv")
    return reason


def cuda_steps(runner, encoder: nn.Module, x: torch.Tensor):
    """The CUDA-graph steps of `x`'s (batch, height, width, dtype, device) (`CudaGraphSteps`, the steady step
    taking 4 frames; chunk 0 alone for a one-frame video), in the runner's `GraphMemory`; None where the graphs
    run eagerly. The caller holds the runner's lock."""
    if not (runner.use_cuda_graphs and runner.graph_backend.can_capture(x.device)):
        return None
    b, _, frames, h, w = x.shape
    rank = b * h * w * x.element_size() // 64  # the scale of a decode of the latents this video encodes to
    return runner.held_steps((b, h, w, x.dtype, x.device, ENCODE), runner.graphs[graph_key(x)], encoder, x, rank,
                             one_frame=frames == FIRST_FRAMES, step_frames=STEP_FRAMES)


def encode_frames(runner, encoder: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The encoder's output for every chunk of the (patchified) video `x` of ``1 + 4k`` frames, joined in time
    (preallocated: no growing `cat`). The caller holds the runner's lock."""
    steps = cuda_steps(runner, encoder, x)
    if steps is None:
        chunk0, steady = runner.graphs[graph_key(x)]
        steps = EagerSteps(chunk0, steady, chunk0.weights(encoder), [] if x.shape[2] == 1 else steady.weights(encoder))
    y = steps.first(x[:, :, :FIRST_FRAMES])
    chunks = 1 + (x.shape[2] - FIRST_FRAMES) // STEP_FRAMES
    out = y.new_empty((*y.shape[:2], chunks * y.shape[2], *y.shape[3:]))
    out[:, :, : y.shape[2]] = y
    for i in range(1, chunks):
        start = FIRST_FRAMES + (i - 1) * STEP_FRAMES
        y = steps.next(x[:, :, start: start + STEP_FRAMES])
        out[:, :, i * y.shape[2]: (i + 1) * y.shape[2]] = y
    return out


@torch.compiler.disable  # torch.compile on top runs this as it is: the graphs are already compiled
def optimized_encode(vae: nn.Module, x: torch.Tensor):
    """Replacement for `AutoencoderKLWan._encode` (and Qwen-Image's), bound to the instance by `WanRunner.install`:
    the value diffusers' `_encode` returns, ``[B, 2 * z_dim, 1 + k, H', W']`` (module docstring)."""
    runner = installed_runner(vae)
    check_video(vae, x)
    if encodes_tiled(vae, x.shape[3], x.shape[4]):
        runner.fallbacks.took_reference(TILED_ENCODE)
        return runner.reference_encode(x)
    used = FIRST_FRAMES + (x.shape[2] - FIRST_FRAMES) // STEP_FRAMES * STEP_FRAMES  # `_encode` reads no others
    video = x[:, :, :used]
    if getattr(vae.config, "patch_size", None) is not None:  # Wan 2.2; Qwen-Image's config has no such key
        from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

        video = patchify(video, patch_size=vae.config.patch_size)

    def serve() -> tuple[torch.Tensor | None, str | None]:
        reason = encode_reason(runner, vae, video)
        if reason is not None:
            return None, reason
        return encode_frames(runner, vae.encoder, video), None

    with runner.lock.holding(x.device), CAPTURE_GATE.running():
        out, reason = runner.within_memory(serve) or (None, OUT_OF_MEMORY_REASON)
        if out is None:
            runner.fallbacks.took_reference(reason)
            return runner.reference_encode(x)
        runner.fallbacks.took_graphs()
    enc = vae.quant_conv(out)
    vae.clear_cache()  # the reference leaves empty caches behind; keep that observable state the same
    return enc


@torch.no_grad()
def warmup_encode(runner, device: torch.device, dtype: torch.dtype, batch: int, shapes, frames) -> list[tuple]:
    """`warmup(..., encode_shapes=[(height, width), ...], encode_frames=...)`: encode a zero video of each size
    (video pixels, largest first: they share the decoder's graph memory) through the graphs, capturing what the
    first encode of that size would: 5 frames (chunk 0 and one steady step), or 1 where every count in
    `frames` (video frames) is 1, which gets chunk 0's CUDA graph alone. Returns ``(batch, height, width,
    "encode")`` per size; RuntimeError where the graphs cannot serve a size."""
    pairs = latent_sizes(shapes, "encode_shapes must be a list of (height, width) pairs of positive ints in video "
                                 "pixels, e.g. [(480, 832)]")
    counts = frame_counts(frames, "encode_frames must be a positive video frame count or a list of them, "
                                  "e.g. 81 or [1, 81]")
    if not pairs:
        raise ValueError("warmup: encode_frames= needs encode_shapes=[(height, width), ...]: the encoder's CUDA graphs "
                         "are per video size")
    count = FIRST_FRAMES if counts and max(counts) == FIRST_FRAMES else FIRST_FRAMES + STEP_FRAMES
    for height, width in sorted(pairs, key=lambda pair: -pair[0] * pair[1]):
        video = torch.zeros(batch, video_channels(runner.vae), count, height, width, device=device, dtype=dtype)
        runner.vae._encode(video)
        if runner.fallbacks.last_path != "graphs":
            raise RuntimeError(f"warmup: the encoder's graphs cannot serve {tuple(video.shape)} {dtype} on {device}: "
                               f"{runner.fallbacks.last_reason}")
    return [(batch, height, width, ENCODE) for height, width in pairs]
