"""A resnet shortcut conv's bias deferred into the epilogue that adds the shortcut as the residual.

Matches:  s = rewrite::pointwise_conv3d(x, shortcut_weight, shortcut_bias)
          rewrite::rms_norm_causal_conv3d(y, gamma, ..., weight, bias, s, x_bias, None, False)
          (after `pointwise_conv3d` and `rms_norm_causal_conv3d` matched; s has no other user; the main conv's
          arguments named by `rewrite.models.wan.ops.ConvStage`; its bias, the cache and x_bias each present
          or absent)
Replaces: s' = rewrite::pointwise_conv3d(x, shortcut_weight, None)
          rewrite::rms_norm_causal_conv3d(y, gamma, ..., weight, bias, s', x_bias, shortcut_bias, False)
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

import functools

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan.ops import ConvStage  # (importing it registers torch.ops.rewrite.*)
from rewrite.patterns.common.guards import conv_bias_deferrable

rewrite_ops = torch.ops.rewrite


def search(x, shortcut_weight, shortcut_bias, y, stage: ConvStage, x_bias):
    shortcut = rewrite_ops.pointwise_conv3d.default(x, shortcut_weight, shortcut_bias)
    out = rewrite_ops.rms_norm_causal_conv3d.default(y, *stage, shortcut, x_bias, None, False)
    return out[0], out[1]


def replace(x, shortcut_weight, shortcut_bias, y, stage: ConvStage, x_bias):
    shortcut = rewrite_ops.pointwise_conv3d.default(x, shortcut_weight, None)
    out = rewrite_ops.rms_norm_causal_conv3d.default(y, *stage, shortcut, x_bias, shortcut_bias, False)
    return out[0], out[1]


guard = functools.partial(conv_bias_deferrable, weight="shortcut_weight", bias="shortcut_bias")
PATTERNS = variants(search, replace, guard, name="residual_bias", exactness="exact", level="lossless",
                    optional=("bias", "cache", "x_bias"), module_types=("WanResidualBlock",))
