"""A padded window's valid length, read by the Triton kernels on the device so that they skip the padded tail.

A `channels_last` bucket graph decodes a clip right-padded to the bucket (`rewrite.models.auk.runner`), and the
caller keeps only the first ``frames`` latent frames' samples. Output sample ``n`` depends on layer positions
up to ``n`` plus the decoder's right reach (`AuKVAE.decode_context_frames()`, 7 latent frames), so a layer
whose ``T`` positions are ``scale = T / bucket`` per latent frame only has to compute its first
``(frames + margin) * scale`` positions for the kept samples to come out the same, bit for bit, as from the
whole bucket: what lies past that (stale memory) reaches no kept sample, provided ``margin`` covers the
reach. The runner keeps ``frames`` in a one-element int32 device tensor that its CUDA graphs were captured
reading (written before each replay), and runs its graph inside `valid_frames`; the fused activation and the
Triton conv then return early from time blocks past the limit (`kernel_args`). Everything else (cuDNN convs,
elementwise ops) still computes the whole bucket. Exactness: the kept samples are ``torch.equal`` to the
unskipped bucket decode (tests/models/auk/test_full_size_decodes.py checks it after replays of other content).

Outside `valid_frames`, or for a tensor whose length is not a multiple of the bucket, nothing is skipped. The
limit is a setting of the run context (`rewrite.ops.run_context`): it holds in the thread that set it only.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor

from rewrite.ops import run_context

__all__ = ["kernel_args", "valid_frames"]

_unlimited: dict[torch.device, Tensor] = {}  # a pointer to pass when nothing is skipped (never read)


@contextlib.contextmanager
def valid_frames(frames: Tensor, bucket: int, margin: int) -> Iterator[None]:
    """Within: kernels over a ``bucket``-frame window compute only the positions of its first ``frames[0] +
    margin`` latent frames. ``frames``: int32 ``[1]`` on the kernels' device, read when they run (so a CUDA
    graph captured here follows later writes to it)."""
    if frames.dtype != torch.int32 or frames.numel() != 1:
        raise ValueError(f"valid_frames: expected an int32 tensor of one element, got {frames.dtype} {tuple(frames.shape)}")
    if bucket < 1 or margin < 0:
        raise ValueError(f"valid_frames: bucket must be >= 1 and margin >= 0, got {bucket}, {margin}")
    with run_context.using(valid_frames=run_context.ValidFrames(frames, bucket, margin)):
        yield


def kernel_args(length: int, device: torch.device) -> tuple[Tensor, int, int]:
    """``(limit_ptr, limit_scale, limit_extra)`` for a kernel writing ``length`` positions on ``device``: it
    computes positions below ``limit_ptr[0] * limit_scale + limit_extra`` (and may skip the others); a scale
    of 0 means no limit (``limit_ptr`` is then a placeholder that is never read)."""
    limit = run_context.current().valid_frames
    if limit is not None:
        frames, bucket, margin = limit
        if frames.device == device and length % bucket == 0:
            scale = length // bucket
            return frames, scale, margin * scale
    placeholder = _unlimited.get(device)
    if placeholder is None:
        placeholder = _unlimited[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return placeholder, 0, 0
