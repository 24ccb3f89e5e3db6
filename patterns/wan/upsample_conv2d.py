"""The nearest-exact 2x upsample feeding its conv2d (Wan's `Resample`: upsample, then a 3x3 conv).

Matches:  conv2d(rewrite::upsample_nearest2x(x, upcast), weight, bias, stride, padding)
          (after `upsample_nearest2x` matched; the upsampled tensor has no other user)
Replaces: rewrite::upsample_conv2d(x, upcast, weight, bias, stride, padding)
Exactness: exact. The upsample is pixel duplication written channels-last; cuDNN convolves it in that
          layout only for shapes where `selftest.channels_last_conv_is_exact` found the output `torch.equal`
          to the NCHW conv on the running GPU (else the op runs the replaced ops); the bias is added with
          ATen's rounding.
Level: lossless.
Guard: x is 4-D.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten
rewrite_ops = torch.ops.rewrite


def search(x, weight, bias, upcast, stride, padding):
    return aten.conv2d.default(rewrite_ops.upsample_nearest2x.default(x, upcast), weight, bias, stride, padding)


def replace(x, weight, bias, upcast, stride, padding):
    return rewrite_ops.upsample_conv2d.default(x, upcast, weight, bias, stride, padding)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    return None if x.dim() == 4 else f"x is {x.dim()}-D, expected [n, c, h, w]"


PATTERNS = variants(search, replace, guard, name="upsample_conv2d", exactness="exact", level="lossless",
                    scalars=("upcast", "stride", "padding"), optional=("bias",), module_types=("WanResample",))
