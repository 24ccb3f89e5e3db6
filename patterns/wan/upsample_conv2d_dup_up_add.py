"""The end of a Wan 2.2 up block: the upsampler's conv2d output unfolded to frames, plus the DupUp3D shortcut.

Matches:  rewrite::dup_up_add(permute(view(rewrite::upsample_conv2d(x, upcast, weight, bias, stride, padding),
                                            frames_shape), [0, 2, 1, 3, 4]),
                              dx, repeats, unfold_shape, fold_shape, first_frame)
          (after `upsample_conv2d` and `dup_up_add` matched; the conv output and its views have no other user)
Replaces: rewrite::upsample_conv2d_dup_up_add(x, upcast, weight, bias, stride, padding, frames_shape, dx,
                                              repeats, unfold_shape, fold_shape, first_frame)
Exactness: exact. The conv is `upsample_conv2d`'s; its epilogue adds the bias (ATen's rounding) and the
          gathered shortcut (the add's rounding) in one pass, so the conv output in the reference layout is
          never stored and read back. Where a piece is not proven for the shape, the two ops run.
Level: lossless.
Guard: x is 4-D, `frames_shape` is the 5-D [b, t, c, h, w] view of the conv output.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten
rewrite_ops = torch.ops.rewrite


def search(x, weight, bias, dx, upcast, stride, padding, frames_shape, repeats, unfold_shape, fold_shape, first_frame):
    y = rewrite_ops.upsample_conv2d.default(x, upcast, weight, bias, stride, padding)
    main = aten.permute.default(aten.view.default(y, frames_shape), [0, 2, 1, 3, 4])
    return rewrite_ops.dup_up_add.default(main, dx, repeats, unfold_shape, fold_shape, first_frame)


def replace(x, weight, bias, dx, upcast, stride, padding, frames_shape, repeats, unfold_shape, fold_shape,
            first_frame):
    return rewrite_ops.upsample_conv2d_dup_up_add.default(x, upcast, weight, bias, stride, padding, frames_shape, dx,
                                                          repeats, unfold_shape, fold_shape, first_frame)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    if x.dim() != 4:
        return f"x is {x.dim()}-D, expected [n, c, h, w]"
    if len(match.scalars["frames_shape"]) != 5:
        return f"the conv output is viewed as {len(match.scalars['frames_shape'])}-D, expected [b, t, c, h, w]"
    return None


PATTERNS = variants(search, replace, guard, name="upsample_conv2d_dup_up_add", exactness="exact", level="lossless",
                    scalars=("upcast", "stride", "padding", "frames_shape", "repeats", "unfold_shape", "fold_shape",
                             "first_frame"),
                    optional=("bias",), module_types=("WanResidualUpBlock", "WanResample"))
