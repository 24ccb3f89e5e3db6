"""A causal conv's bias deferred into the norm that reads its output (the `conv1 -> norm2` of a residual block).

Matches:  a = rewrite::rms_norm_causal_conv3d(x, gamma, ..., weight, bias, None, None, None, False)
          b = rewrite::rms_norm_causal_conv3d(a[0], gamma2, ..., weight2, bias2, residual, None, residual_bias,
                                              False)
          (after `rms_norm_causal_conv3d` and `residual_bias` matched; a's output has no other user; the caches,
          bias2, residual and residual_bias each present or absent; family `norm_input_bias_identity`: the
          residual is x itself, the block input of an identity shortcut)
Replaces: a' = rewrite::rms_norm_causal_conv3d(x, ..., weight, None, None, None, None, True)
          rewrite::rms_norm_causal_conv3d(a'[0], gamma2, ..., residual, bias, residual_bias, False)
Exactness: exact. The first op returns cuDNN's channels-last conv output as it is (no epilogue pass writing
          `conv + bias` in the reference layout); the second op's norm kernel adds the bias as it reads it,
          with the `add_` rounding, and sums the squares in the order ATen's norm has for the contiguous
          tensor the replaced graph had there. Where either op falls back, its reference path completes the
          bias the same way.
Level: lossless.
Guard: a CUDA graph (ATen's cuDNN conv adds the bias with a separate `add_`; a CPU conv may fold it into the
          sum; with cuDNN switched off at run time the Wan runtime takes the reference path,
          `guards.cudnn_reason`); the bias has one value per output channel of the first conv.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan.ops import ConvStage  # (importing it registers torch.ops.rewrite.*)
from rewrite.patterns.common.guards import conv_bias_deferrable  # the conditions on the conv whose bias moves

rewrite_ops = torch.ops.rewrite


def _chain(x, stage: ConvStage, stage2: ConvStage, residual, residual_bias, deferred: bool):
    """The two ops, with the first conv's bias in its own epilogue (`deferred` False) or in the second norm."""
    first = rewrite_ops.rms_norm_causal_conv3d.default(x, *stage[:-1], None if deferred else stage.bias, None, None,
                                                       None, deferred)
    second = rewrite_ops.rms_norm_causal_conv3d.default(first[0], *stage2, residual,
                                                        stage.bias if deferred else None, residual_bias, False)
    return first[1], second[0], second[1]


def search(x, stage: ConvStage, stage2: ConvStage, residual, residual_bias):
    return _chain(x, stage, stage2, residual, residual_bias, deferred=False)


def replace(x, stage: ConvStage, stage2: ConvStage, residual, residual_bias):
    return _chain(x, stage, stage2, residual, residual_bias, deferred=True)


def search_identity(x, stage: ConvStage, stage2: ConvStage):
    """The residual is the first norm's input (an identity shortcut): one graph node for two roles."""
    return _chain(x, stage, stage2, x, None, deferred=False)


def replace_identity(x, stage: ConvStage, stage2: ConvStage):
    return _chain(x, stage, stage2, x, None, deferred=True)


PATTERNS = (variants(search_identity, replace_identity, conv_bias_deferrable, name="norm_input_bias_identity", exactness="exact",
                     level="lossless", optional=("bias2", "cache", "cache2"),
                     module_types=("WanResidualBlock",))
            + variants(search, replace, conv_bias_deferrable, name="norm_input_bias", exactness="exact", level="lossless",
                       optional=("residual_bias", "residual", "bias2", "cache", "cache2"),
                       module_types=("WanResidualBlock",)))
