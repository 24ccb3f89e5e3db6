"""A resnet shortcut conv's bias deferred into the epilogue that adds the shortcut as the residual.

Matches:  s = rewrite::pointwise_conv3d(x, weight, bias)
          rewrite::rms_norm_causal_conv3d(y, gamma, ..., weight2, bias2, s, x_bias, None, False)
          (after `pointwise_conv3d` and `rms_norm_causal_conv3d` matched; s has no other user; bias2, the cache
          and x_bias each present or absent)
Replaces: s' = rewrite::pointwise_conv3d(x, weight, None)
          rewrite::rms_norm_causal_conv3d(y, gamma, ..., weight2, bias2, s', x_bias, bias, False)
Exactness: exact. ATen's conv adds its bias with a separate `add_` (one rounding), and the epilogue that reads
          the shortcut adds it with that rounding before the residual add, so the shortcut is never written
          with its bias and read back; the op's reference path completes the shortcut first
          (`with_deferred_bias`).
Level: lossless.
Guard: a CUDA graph (ATen's cuDNN conv adds the bias with a separate `add_`; a CPU conv may fold it into the
          sum; with cuDNN switched off at run time the Wan runtime takes the reference path,
          `guards.cudnn_reason`); the bias has one value per output channel of the shortcut conv.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.patterns.common.guards import conv_bias_deferrable

rewrite_ops = torch.ops.rewrite


def search(x, weight, bias, y, gamma, cache, weight2, bias2, x_bias, scale, norm_bias, eps, upcast, act, pad, mode):
    shortcut = rewrite_ops.pointwise_conv3d.default(x, weight, bias)
    out = rewrite_ops.rms_norm_causal_conv3d.default(y, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode,
                                                     weight2, bias2, shortcut, x_bias, None, False)
    return out[0], out[1]


def replace(x, weight, bias, y, gamma, cache, weight2, bias2, x_bias, scale, norm_bias, eps, upcast, act, pad, mode):
    shortcut = rewrite_ops.pointwise_conv3d.default(x, weight, None)
    out = rewrite_ops.rms_norm_causal_conv3d.default(y, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode,
                                                     weight2, bias2, shortcut, x_bias, bias, False)
    return out[0], out[1]


PATTERNS = variants(search, replace, conv_bias_deferrable, name="residual_bias", exactness="exact", level="lossless",
                    scalars=("scale", "norm_bias", "eps", "upcast", "act", "pad", "mode"),
                    optional=("bias2", "cache", "x_bias"), module_types=("WanResidualBlock",))
