"""Wan 2.2's up-block end with the upsampler conv by output phases, as one cuDNN conv (level ``channels_last``).

Matches:  rewrite::upsample_conv2d_dup_up_add(x, upcast, weight, bias, stride, padding, frames_shape, dx, repeats,
                                              unfold_shape, fold_shape, first_frame)
          (after `upsample_conv2d_dup_up_add` built it; bias present or absent)
Replaces: rewrite::upsample_conv2d_dup_up_add_fast(the same arguments) (`rewrite.models.wan.upsample_fast`): the four
          output phases' 2x2 convs as one cuDNN conv with four times the output channels, gathered by the
          DupUp epilogue pass the replaced op also runs; no upsampled tensor, 4/9 of the products.
Exactness: tolerance. The summed 2x2 weights are rounded once to the weight dtype and cuDNN's fp32 sums run in
          another order than the 3x3 conv's (the README's `channels_last` contract; measured in docs/results.md).
          Where the op's kernel path does not serve a call, it runs the replaced `lossless` op.
Level: channels_last.
Guard: the graph runs on CUDA (or on CPU under the Triton interpreter, for tests), and
          `wan_upsample_fast.dup_up_phases_reason` accepts the conv: a 3x3 unit-stride conv padded by 1 of a 4-D x,
          bf16/fp16, a channel pair the phase conv measured faster for.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import upsample_fast as wan_upsample_fast
from rewrite.patterns.common.guards import triton_kernel_runs

rewrite_ops = torch.ops.rewrite


def search(x, weight, bias, dx, upcast, stride, padding, frames_shape, repeats, unfold_shape, fold_shape, first_frame):
    return rewrite_ops.upsample_conv2d_dup_up_add.default(x, upcast, weight, bias, stride, padding, frames_shape, dx,
                                                          repeats, unfold_shape, fold_shape, first_frame)


def replace(x, weight, bias, dx, upcast, stride, padding, frames_shape, repeats, unfold_shape, fold_shape,
            first_frame):
    return rewrite_ops.upsample_conv2d_dup_up_add_fast.default(x, upcast, weight, bias, stride, padding, frames_shape,
                                                               dx, repeats, unfold_shape, fold_shape, first_frame)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    reason = triton_kernel_runs(x.device, "the phase epilogue")
    if reason is not None:
        return reason
    weight = match.inputs["weight"].meta["val"]
    return wan_upsample_fast.dup_up_phases_reason(tuple(x.shape), tuple(weight.shape), match.scalars["stride"],
                                                  match.scalars["padding"], x.dtype)


PATTERNS = variants(search, replace, guard, name="upsample_conv2d_dup_up_add_fast", exactness="tolerance",
                    level="channels_last",
                    scalars=("upcast", "stride", "padding", "frames_shape", "repeats", "unfold_shape", "fold_shape",
                             "first_frame"),
                    optional=("bias",), module_types=("WanResidualUpBlock", "WanResample"))
