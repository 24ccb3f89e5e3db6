"""Wan 2.2's `AvgDown3D` shortcut plus the residual add that ends `WanResidualDownBlock` (the encoder's down blocks).

Matches:  d = mean(view(view(contiguous(permute(view([pad(]x[, pad)], unfold), [0,1,3,5,7,2,4,6])), channels),
                   fold), [2])
          main + d
          (the pad by pad_t frames in front is absent where export left none)
Replaces: rewrite::avg_down_add(main, x, pad, unfold, channels, fold) (`rewrite.models.wan.downsample`): each output
          gathered from x and averaged in one pass, where ATen runs a pad, a permuted copy of the block input, a mean
          and the add.
Exactness: exact. The kernel sums each group in the order of ATen's CUDA mean (`Reduce.cuh`'s four
          accumulators, one thread per output for groups of at most 8) with its rounding points, and writes the
          layout ATen's add gives; the GPU test (tests/kernels/downsample/test_avg_down.py) holds it to
          `torch.equal` with diffusers' module and add. Where the op's kernel path does not serve a call, it runs
          the replaced ops.
Level: lossless.
Guard: the graph runs on CUDA (or on CPU under the Triton interpreter, for tests); x is 5-D with main's dtype; the
          views unfold x's (t, h, w) by (factor_t, factor_s, factor_s) into channels and group them as
          `rewrite.kernels.downsample.avg_down.avg_down_add_reason` accepts; the pad pads frames in front only;
          main has the add's shape and dtype.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.kernels.downsample import avg_down as triton_avg_down
from rewrite.models.wan import downsample as wan_downsample
from rewrite.patterns.common.guards import triton_kernel_runs

aten = torch.ops.aten
rewrite_ops = torch.ops.rewrite

_NO_PAD = [0, 0, 0, 0, 0, 0]


def _avg_down(x, unfold_shape, channels_shape, fold_shape):
    unfolded = aten.contiguous.default(aten.permute.default(aten.view.default(x, unfold_shape),
                                                            [0, 1, 3, 5, 7, 2, 4, 6]))
    return aten.mean.dim(aten.view.default(aten.view.default(unfolded, channels_shape), fold_shape), [2])


def search(main, x, unfold_shape, channels_shape, fold_shape, padded):
    return aten.add.Tensor(main, _avg_down(x, unfold_shape, channels_shape, fold_shape))


def replace(main, x, unfold_shape, channels_shape, fold_shape, padded):
    return rewrite_ops.avg_down_add.default(main, x, _NO_PAD, unfold_shape, channels_shape, fold_shape)


def search_padded(main, x, pad, unfold_shape, channels_shape, fold_shape, padded):
    return aten.add.Tensor(main, _avg_down(aten.pad.default(x, pad), unfold_shape, channels_shape, fold_shape))


def replace_padded(main, x, pad, unfold_shape, channels_shape, fold_shape, padded):
    return rewrite_ops.avg_down_add.default(main, x, pad, unfold_shape, channels_shape, fold_shape)


def guard(match) -> str | None:
    x, main, out = match.inputs["x"].meta["val"], match.inputs["main"].meta["val"], match.outputs[0].meta["val"]
    reason = triton_kernel_runs(x.device, "the AvgDown3D gather")
    if reason is not None:
        return reason
    pad = match.scalars.get("pad", _NO_PAD)
    unfold, fold = match.scalars["unfold_shape"], match.scalars["fold_shape"]
    if x.dim() != 5 or len(unfold) != 8 or len(fold) != 6 or len(pad) != 6:
        return "expected a 5-D input unfolded into 8 dims and grouped into 6, and a 6-entry pad"
    if not all(type(v) is int for v in (*pad, unfold[3], unfold[5], unfold[7], fold[2])):
        return "the pad, the unfold factors and the group size must be static"
    if any(pad[:4]) or pad[5] or unfold[5] != unfold[7]:
        return f"pad {list(pad)} / unfold factors ({unfold[3]}, {unfold[5]}, {unfold[7]}): expected a pad of frames " \
               "in front and one spatial factor"
    if tuple(main.shape) != tuple(out.shape) or main.dtype != out.dtype or x.dtype != main.dtype:
        return f"main {tuple(main.shape)} {main.dtype} (x {x.dtype}) would broadcast or promote into " \
               f"{tuple(out.shape)} {out.dtype}"
    factors = wan_downsample.avg_down_factors(pad, unfold, fold)
    return triton_avg_down.avg_down_add_reason(tuple(main.shape), tuple(x.shape), *factors)


_COMMON = dict(name="avg_down_add", exactness="exact", level="lossless",
               module_types=("WanResidualDownBlock", "AvgDown3D"))
PATTERNS = (
    variants(search_padded, replace_padded, guard, scalars=("pad", "unfold_shape", "channels_shape", "fold_shape"),
             padded=(True,), **_COMMON)
    + variants(search, replace, guard, scalars=("unfold_shape", "channels_shape", "fold_shape"), padded=(False,),
               **_COMMON)
)
