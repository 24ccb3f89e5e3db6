"""An AuK residual unit's first conv bias, deferred into the activation kernel that reads it.

Matches:  h = rewrite::alias_free_snake_causal_conv1d(x, alpha1, beta1, taps1, True, weight1, bias1, dilation1, None)
          y = rewrite::alias_free_snake_causal_conv1d(h, alpha2, ..., bias2, dilation2, x)
          (each stage's arguments named by `rewrite.models.auk.alias_free.SnakeConvStage`)
          (`AMPBlock`'s residual unit ``x + conv2(act2(conv1(act1(x))))`` after `snake_causal_conv1d` fused
          each act -> conv pair; variant `residual_unit=False`: the same pair without the residual)
Replaces: the first conv without its bias, and the second op given ``x_bias=bias1``: its activation
          kernel reads ``h + bias1`` (rounded to h's dtype) as it loads h, so the separate bias pass over h
          goes away (`rewrite.models.auk.alias_free`).
Exactness: exact against the two ops it replaces: ATen's CUDA conv adds its bias with a separate ``add_``
          after cuDNN, which rounds ``conv + bias`` once to h's dtype; the kernel rounds the same sum the
          same way (torch.equal in the tests). Where the op runs the Triton conv instead (tolerance anyway),
          fp32 stays the same sum rounded once; fp16/bf16 round the conv output before the bias is added.
Level: channels_last (it rewrites the channels_last-only fused op).
Guard: a CUDA graph (`patterns._guards.conv_bias_deferrable`: a CPU conv may fold its bias into the sum,
          differently per instruction set and shape, so on the CPU the bias stays in the conv); bias1 is a
          ``[C]`` tensor of weight1's dtype (C: weight1's output channels).
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.auk.alias_free import SnakeConvStage  # (importing it registers the op)
from rewrite.patterns.common.guards import conv_bias_deferrable

snake_conv = torch.ops.rewrite.alias_free_snake_causal_conv1d.default


def _snake_conv(x, stage: SnakeConvStage, bias, residual=None, *x_bias):
    return snake_conv(x, stage.alpha, stage.beta, stage.taps, True, stage.weight, bias, stage.dilation, residual,
                      *x_bias)


def search(x, stage1: SnakeConvStage, stage2: SnakeConvStage, *, residual_unit):
    h = _snake_conv(x, stage1, stage1.bias)
    return _snake_conv(h, stage2, stage2.bias, x if residual_unit else None)


def replace(x, stage1: SnakeConvStage, stage2: SnakeConvStage, *, residual_unit):
    h = _snake_conv(x, stage1, None)
    return _snake_conv(h, stage2, stage2.bias, x if residual_unit else None, stage1.bias)


def guard(match) -> str | None:
    reason = conv_bias_deferrable(match, weight="weight1", bias="bias1")
    if reason is not None:
        return reason
    bias = match.inputs["bias1"].meta["val"]
    weight = match.inputs["weight1"].meta["val"]
    if bias.dtype != weight.dtype:
        return f"bias1 is {bias.dtype}, weight1 {weight.dtype}"
    return None


PATTERNS = variants(search, replace, guard, name="deferred_conv_bias", exactness="exact", level="channels_last",
                    residual_unit=(True, False),
                    module_types=("AliasFreeSnakeBeta", "CausalConv1d"))
