"""Temporal interleave after Wan's `time_conv` (upsample3d): channel halves become interleaved frames.

Matches:  r = reshape(y, [b, 2, c, t, h, w]); reshape(stack([r[:, 0], r[:, 1]], 3), [b, c, 2t, h, w])
Replaces: rewrite::temporal_interleave(y)
Exactness: exact (pure data movement).
Level: lossless.
Guard: y is 5-D with an even channel count and the reshape splits it into two halves.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten


def search(y, split_shape, merged_shape):
    r = aten.reshape.default(y, split_shape)
    s = aten.stack.default([aten.select.int(r, 1, 0), aten.select.int(r, 1, 1)], 3)
    return aten.reshape.default(s, merged_shape)


def replace(y, split_shape, merged_shape):
    return torch.ops.rewrite.temporal_interleave.default(y)


def guard(match) -> str | None:
    y = match.inputs["y"].meta["val"]
    out = match.outputs[0].meta["val"]
    if y.dim() != 5 or out.dim() != 5:
        return "expected 5-D input and output"
    b, c2, t, h, w = y.shape
    if len(match.scalars["split_shape"]) != 6 or match.scalars["split_shape"][1] != 2 or c2 % 2:
        return f"reshape {match.scalars['split_shape']} does not split {c2} channels into two halves"
    if out.shape[1] != c2 // 2:
        return f"output has {out.shape[1]} channels, expected {c2 // 2}"
    return None


PATTERNS = variants(search, replace, guard, name="temporal_interleave", exactness="exact", level="lossless",
                    scalars=("split_shape", "merged_shape"), module_types=("WanResample",))
