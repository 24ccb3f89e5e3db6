"""A Wan causal conv3d with a 1x1x1 kernel (the resnet shortcut when the channel count changes).

Matches:  conv3d(pad(x, [0, 0, 0, 0, 0, 0]), weight, bias)   (bias present or absent)
Replaces: rewrite::pointwise_conv3d(x, weight, bias)
Exactness: exact. For a frame-major x (Wan 2.2's up blocks leave their output so) cuDNN's conv2d runs over the
          frames folded into the batch, without ATen's two copies of x, only for shapes where
          `selftest.frame_conv_is_exact` found it `torch.equal` to the NCDHW conv3d on the running GPU; the bias
          is ATen's `add_` either way. Elsewhere the replaced ops run.
Level: lossless.
Guard: x is 5-D, the pad is all zeros, the weight is [c_out, c_in, 1, 1, 1]; every user of the conv output is a
          `rewrite` op (the output may be frame-major where the replaced conv's was NCDHW: those ops read any
          layout, while an ATen view could not).
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten
rewrite_ops = torch.ops.rewrite


def search(x, weight, bias, pad):
    return aten.conv3d.default(aten.pad.default(x, pad), weight, bias)


def replace(x, weight, bias, pad):
    return rewrite_ops.pointwise_conv3d.default(x, weight, bias)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    if x.dim() != 5:
        return f"x is {x.dim()}-D, expected [b, c, t, h, w]"
    if any(match.scalars["pad"]):
        return f"pad {list(match.scalars['pad'])} is not all zeros"
    weight_shape = tuple(match.inputs["weight"].meta["val"].shape)
    if len(weight_shape) != 5 or weight_shape[2:] != (1, 1, 1):
        return f"weight {list(weight_shape)} is not [c_out, c_in, 1, 1, 1]"
    outsiders = sorted({str(user.target) for user in match.anchor.users
                        if getattr(user.target, "namespace", None) != "rewrite"})
    if outsiders:
        return f"the conv output feeds {', '.join(outsiders)}, which may depend on its layout"
    return None


PATTERNS = variants(search, replace, guard, name="pointwise_conv3d", exactness="exact", level="lossless",
                    scalars=("pad",), optional=("bias",), module_types=("WanCausalConv3d",))
