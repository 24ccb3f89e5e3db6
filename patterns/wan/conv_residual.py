"""Conv3d (with its bias) followed by the residual add of a Wan residual block.

Matches:  conv3d(x, weight, bias) + residual   (either operand order)
Replaces: rewrite::conv3d_residual(x, weight, bias, residual)
Exactness: exact (the op runs the same conv and add; a deferred-bias kernel must keep ATen's rounding).
Level: lossless.
Guard: 5-D conv output of the residual's shape and dtype (no broadcasting in the add).
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten


def search(x, weight, bias, residual):
    return aten.add.Tensor(aten.conv3d.default(x, weight, bias), residual)


def replace(x, weight, bias, residual):
    return torch.ops.rewrite.conv3d_residual.default(x, weight, bias, residual)


def guard(match) -> str | None:
    out = match.outputs[0].meta["val"]
    residual = match.inputs["residual"].meta["val"]
    if out.dim() != 5 or tuple(out.shape) != tuple(residual.shape) or out.dtype != residual.dtype:
        return f"residual {tuple(residual.shape)} {residual.dtype} does not match the conv output {tuple(out.shape)} {out.dtype}"
    return None


PATTERNS = variants(search, replace, guard, name="conv3d_residual", exactness="exact", level="lossless",
                    module_types=("WanResidualBlock",), commute=("add",))
