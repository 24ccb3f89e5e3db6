"""Causal conv input assembly (cache concatenation + zero pad) together with the next chunk's cache.

Matches: (x: the conv's input chunk, cache: its 2-frame cache input, pad: the conv's pad list; the tail slice
`x[:, :, -2:]` may also start at `-frames` where x has fewer than 2 frames, the same frames: Qwen-Image's decoder
writes the slice as `x[:, :, -min(2, frames):]`)
  mode=steady_t1  pad(cat([cache, x], 2)) and cat([cache[:, :, -1:], x[:, :, -2:].clone()], 2)   (x has 1 frame)
  mode=steady     pad(cat([cache, x], 2)) and x[:, :, -2:].clone()                               (x has >= 2 frames)
  mode=chunk0     pad(x)                  and cat([zeros_like(t), t], 2), t = x[:, :, -2:].clone()
Two outputs (a multi-output match): the conv input and the next cache. The conv itself stays a cuDNN conv.
Replaces: rewrite::causal_conv_input(x, cache, pad, mode) -> (conv input, next cache)
Exactness: exact (pure data movement).
Level: lossless.
Guard: x is 5-D; steady_t1 needs exactly 1 frame, steady at least 2; the tail slice starts at -2 (or at -frames,
for fewer than 2 frames); the cache has x's dtype.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.models.wan.reference import END

aten = torch.ops.aten


def search_steady(x, cache, pad, start, mode):
    tail = aten.clone.default(aten.slice.Tensor(x, 2, start, END))
    if mode == "steady_t1":
        tail = aten.cat.default([aten.unsqueeze.default(aten.select.int(cache, 2, -1), 2), tail], 2)
    return aten.pad.default(aten.cat.default([cache, x], 2), pad), tail


def replace_steady(x, cache, pad, start, mode):
    out = torch.ops.rewrite.causal_conv_input.default(x, cache, pad, mode)
    return out[0], out[1]


def search_chunk0(x, pad, start, mode):
    tail = aten.clone.default(aten.slice.Tensor(x, 2, start, END))
    return aten.pad.default(x, pad), aten.cat.default([aten.zeros_like.default(tail, pin_memory=False), tail], 2)


def replace_chunk0(x, pad, start, mode):
    out = torch.ops.rewrite.causal_conv_input.default(x, None, pad, mode)
    return out[0], out[1]


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    mode = dict(match.pattern.variant)["mode"]
    if x.dim() != 5:
        return f"x is {x.dim()}-D, expected [b, c, t, h, w]"
    frames = x.shape[2]
    if mode in ("steady_t1", "chunk0") and frames != 1:
        return f"mode {mode} expects a 1-frame chunk, x has {frames} frames"
    if mode == "steady" and not frames >= 2:
        return f"mode steady expects >= 2 frames, x has {frames}"
    start = match.scalars["start"]
    if start != -2 and not (isinstance(frames, int) and frames < 2 and start == -frames):
        return f"the cache slice starts at {start}, not at -2 (or at -frames, fewer than 2 frames)"
    if "cache" in match.inputs and match.inputs["cache"].meta["val"].dtype != x.dtype:
        return "cache and x differ in dtype"
    return None


_COMMON = dict(exactness="exact", level="lossless", name="causal_conv_input", scalars=("pad", "start"),
               module_types=("WanCausalConv3d",))
PATTERNS = (
    variants(search_steady, replace_steady, guard, mode=("steady_t1", "steady"), **_COMMON)
    + variants(search_chunk0, replace_chunk0, guard, mode=("chunk0",), **_COMMON)
)
