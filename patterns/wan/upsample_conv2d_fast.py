"""Wan's upsampler conv2d by output phases, without the upsampled tensor (level ``channels_last``).

Matches:  rewrite::upsample_conv2d(x, upcast, weight, bias, stride, padding)
          (after `upsample_conv2d` built it and `upsample_conv2d_dup_up_add` took the ones it chains; bias
          present or absent)
Replaces: rewrite::upsample_conv2d_fast(the same arguments) (`rewrite.models.wan.upsample_fast`): each output
          phase (every other row and column) is a 2x2 conv of x with summed weights, by the Triton conv kernel.
Exactness: tolerance. The summed 2x2 weights are rounded once to the weight dtype and the conv's fp32 sum runs
          in another order than cuDNN's (the README's `channels_last` contract; measured in docs/results.md).
          Where the op's kernel path does not serve a call, it runs the replaced `lossless` op.
Level: channels_last.
Guard: the graph runs on CUDA (or on CPU under the Triton interpreter, for tests), and
          `wan_upsample_fast.upsample_reason` accepts the conv: a 3x3 unit-stride conv padded by 1, bf16/fp16,
          a channel pair the phase kernels measured faster for.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import upsample_fast as wan_upsample_fast
from rewrite.patterns.common.guards import triton_kernel_runs

rewrite_ops = torch.ops.rewrite


def search(x, weight, bias, upcast, stride, padding):
    return rewrite_ops.upsample_conv2d.default(x, upcast, weight, bias, stride, padding)


def replace(x, weight, bias, upcast, stride, padding):
    return rewrite_ops.upsample_conv2d_fast.default(x, upcast, weight, bias, stride, padding)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    reason = triton_kernel_runs(x.device, "the Triton conv")
    if reason is not None:
        return reason
    weight = match.inputs["weight"].meta["val"]
    return wan_upsample_fast.upsample_reason(tuple(x.shape), tuple(weight.shape), match.scalars["stride"],
                                    match.scalars["padding"], x.dtype)


PATTERNS = variants(search, replace, guard, name="upsample_conv2d_fast", exactness="tolerance", level="channels_last",
                    scalars=("upcast", "stride", "padding"), optional=("bias",), module_types=("WanResample",))
