"""The Wan encoder's temporal downsample in a steady step (`WanResample` in ``downsample3d`` mode, chunks after
the first): ``time_conv`` (a causal 3x1x1 conv of stride 2 in time, its pad all zeros) over the last cached frame
and the chunk, with the next cache, the chunk's last frame.

Matches:  (two outputs) conv3d(pad(cat([cache[:, :, -1:], x], 2), pad), weight, bias, stride) and
          x[:, :, -1:].clone()
Replaces: rewrite::time_conv(x, cache, pad, weight, bias, stride) -> (conv output, next cache)
Exactness: exact. cuDNN convolves the frames written once into channels-last memory only for shapes and strides
          where `selftest.strided_channels_last_conv_is_exact` found the output `torch.equal` to the NCDHW conv on
          the running GPU (else the op runs the replaced ops); the bias is added with ATen's rounding.
Level: lossless.
Guard: x and the cache are 5-D of one dtype; both slices start at -1; the pad is all zeros.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import downsample as _downsample  # noqa: F401  (registers torch.ops.rewrite.time_conv)
from rewrite.models.wan.reference import END

aten = torch.ops.aten


def search(x, cache, weight, bias, pad, stride, start, cache_start):
    tail = aten.clone.default(aten.slice.Tensor(x, 2, start, END))
    joined = aten.cat.default([aten.slice.Tensor(cache, 2, cache_start, END), x], 2)
    return aten.conv3d.default(aten.pad.default(joined, pad), weight, bias, stride), tail


def replace(x, cache, weight, bias, pad, stride, start, cache_start):
    out = torch.ops.rewrite.time_conv.default(x, cache, pad, weight, bias, stride)
    return out[0], out[1]


def guard(match) -> str | None:
    x, cache = match.inputs["x"].meta["val"], match.inputs["cache"].meta["val"]
    if x.dim() != 5 or cache.dim() != 5:
        return f"x is {x.dim()}-D and the cache {cache.dim()}-D, expected [b, c, t, h, w]"
    if cache.dtype != x.dtype:
        return "cache and x differ in dtype"
    if match.scalars["start"] != -1 or match.scalars["cache_start"] != -1:
        return f"the slices start at {match.scalars['start']} and {match.scalars['cache_start']}, not at -1"
    if any(match.scalars["pad"]):
        return f"the causal pad {list(match.scalars['pad'])} is not all zeros"
    return None


PATTERNS = variants(search, replace, guard, name="time_conv", exactness="exact", level="lossless",
                    scalars=("pad", "stride", "start", "cache_start"), optional=("bias",),
                    module_types=("WanResample",))
