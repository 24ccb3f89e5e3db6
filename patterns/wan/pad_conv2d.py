"""The Wan encoder downsamplers' zero pad + strided conv2d (`WanResample` in ``downsample2d`` / ``downsample3d`` mode:
the frames folded into the batch, ``ZeroPad2d((0, 1, 0, 1))``, a 3x3 conv of stride 2).

Matches:  conv2d(pad(x, pad, "constant", 0.0), weight, bias, stride)   (the padded tensor has no other user)
Replaces: rewrite::pad_conv2d(x, pad, weight, bias, stride)
Exactness: exact. cuDNN convolves the pad written once into channels-last memory only for shapes and strides
          where `selftest.strided_channels_last_conv_is_exact` found the output `torch.equal` to the NCHW conv on
          the running GPU (else the op runs the replaced ops); the bias is added with ATen's rounding.
Level: lossless.
Guard: x is 4-D; the pad has 4 non-negative entries.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import downsample as _downsample  # noqa: F401  (registers torch.ops.rewrite.pad_conv2d)

aten = torch.ops.aten
rewrite_ops = torch.ops.rewrite


def search(x, weight, bias, pad, stride):
    return aten.conv2d.default(aten.pad.default(x, pad, "constant", 0.0), weight, bias, stride)


def replace(x, weight, bias, pad, stride):
    return rewrite_ops.pad_conv2d.default(x, pad, weight, bias, stride)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    pad = match.scalars["pad"]
    if x.dim() != 4:
        return f"x is {x.dim()}-D, expected [n, c, h, w]"
    if len(pad) != 4 or min(pad) < 0:
        return f"pad {list(pad)}: expected 4 non-negative entries (left, right, top, bottom)"
    return None


PATTERNS = variants(search, replace, guard, name="pad_conv2d", exactness="exact", level="lossless",
                    scalars=("pad", "stride"), optional=("bias",), module_types=("WanResample",))
