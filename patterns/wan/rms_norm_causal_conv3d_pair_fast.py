"""A residual block's two fast convs as one op: the second norm (+ SiLU) in the first conv's epilogue.

Matches:  a = rewrite::rms_norm_causal_conv3d_fast(x, gamma, ..., cache, pad, mode, weight, None, None, None,
                                                   None, True)
          b = rewrite::rms_norm_causal_conv3d_fast(a[0], gamma2, ..., cache2, pad2, mode2, weight2, bias2,
                                                   residual, bias, residual_bias, False)
          (the `conv1 -> norm2 -> conv2` of a Wan residual block after `norm_input_bias` deferred conv1's bias
          into the second norm and `rms_norm_causal_conv3d_fast` served both convs; a's output has no other
          user; the caches, bias2, residual and residual_bias each present or absent; family
          `rms_norm_causal_conv3d_pair_fast_identity`: the residual is x itself, an identity shortcut)
Replaces: rewrite::rms_norm_causal_conv3d_pair_fast(x, gamma, ..., weight, bias, gamma2, ..., weight2, bias2,
                                                    residual, residual_bias) (`rewrite.models.wan.ops_fast`): the first
          conv's output is normalized into the second conv's padded input as it leaves the accumulator, never
          written or read back.
Exactness: tolerance (the two fast ops' roundings, except that the first conv's bias is added before its one
          rounding and the second norm's squares are summed in another order than ATen's; the README's
          `channels_last` contract). Where the op's fused path does not serve a call, it runs the two ops.
Level: channels_last.
Guard: `wan_fast.pair_reason` accepts the pair: one program of the first conv's tile holds all its output
          channels, the second norm's activation is SiLU or none, and the second conv is served by the kernel.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.kernels import layout
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.models.wan.ops import ConvStage

rewrite_ops = torch.ops.rewrite


def _chain(x, stage: ConvStage, stage2: ConvStage, residual, residual_bias):
    fast = rewrite_ops.rms_norm_causal_conv3d_fast.default
    first = fast(x, *stage[:-1], None, None, None, None, True)
    second = fast(first[0], *stage2, residual, stage.bias, residual_bias, False)
    return first[1], second[0], second[1]


def _pair(x, stage: ConvStage, stage2: ConvStage, residual, residual_bias):
    out = rewrite_ops.rms_norm_causal_conv3d_pair_fast.default(x, *stage, *stage2, residual, residual_bias)
    return out[1], out[0], out[2]


def search(x, stage: ConvStage, stage2: ConvStage, residual, residual_bias):
    return _chain(x, stage, stage2, residual, residual_bias)


def replace(x, stage: ConvStage, stage2: ConvStage, residual, residual_bias):
    return _pair(x, stage, stage2, residual, residual_bias)


def search_identity(x, stage: ConvStage, stage2: ConvStage):
    """The residual is the first norm's input (an identity shortcut): one graph node for two roles."""
    return _chain(x, stage, stage2, x, None)


def replace_identity(x, stage: ConvStage, stage2: ConvStage):
    return _pair(x, stage, stage2, x, None)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    weight = match.inputs["weight"].meta["val"]
    weight2 = match.inputs["weight2"].meta["val"]
    cache, cache2 = (match.inputs.get(name) for name in ("cache", "cache2"))
    scalars = match.scalars
    in_shape = layout.padded_shape(x.shape, None if cache is None else cache.meta["val"], list(scalars["pad"]),
                                   scalars["mode"])
    y_shape = layout.conv_output_shape(in_shape, weight.shape)
    in_shape2 = layout.padded_shape(y_shape, None if cache2 is None else cache2.meta["val"], list(scalars["pad2"]),
                                    scalars["mode2"])
    return wan_fast.pair_reason(weight.shape[0], weight.shape[1], in_shape2, tuple(weight2.shape), x.dtype,
                                scalars["act2"], x.device)


PATTERNS = (variants(search_identity, replace_identity, guard, name="rms_norm_causal_conv3d_pair_fast_identity",
                     exactness="tolerance", level="channels_last",
                     optional=("bias2", "cache", "cache2"), module_types=("WanResidualBlock",))
            + variants(search, replace, guard, name="rms_norm_causal_conv3d_pair_fast", exactness="tolerance",
                       level="channels_last",
                       optional=("residual_bias", "residual", "bias2", "cache", "cache2"),
                       module_types=("WanResidualBlock",)))
