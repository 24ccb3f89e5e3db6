"""An AuK residual unit's first conv bias, deferred into the activation kernel that reads it.

Matches:  h = rewrite::alias_free_snake_causal_conv1d(x, a1, b1, t1, True, w1, bias1, d1, None)
          y = rewrite::alias_free_snake_causal_conv1d(h, a2, b2, t2, True, w2, bias2, d2, x)
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
          ``[C]`` tensor of w1's dtype (C: w1's output channels).
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.auk import alias_free as _fused_op  # noqa: F401  (registers rewrite::alias_free_snake_causal_conv1d)
from rewrite.patterns.common.guards import conv_bias_deferrable

snake_conv = torch.ops.rewrite.alias_free_snake_causal_conv1d.default


def search(x, a1, b1, t1, w1, bias1, a2, b2, t2, w2, bias2, d1, d2, *, residual_unit):
    h = snake_conv(x, a1, b1, t1, True, w1, bias1, d1, None)
    return snake_conv(h, a2, b2, t2, True, w2, bias2, d2, x if residual_unit else None)


def replace(x, a1, b1, t1, w1, bias1, a2, b2, t2, w2, bias2, d1, d2, *, residual_unit):
    h = snake_conv(x, a1, b1, t1, True, w1, None, d1, None)
    return snake_conv(h, a2, b2, t2, True, w2, bias2, d2, x if residual_unit else None, bias1)


def guard(match) -> str | None:
    reason = conv_bias_deferrable(match, weight="w1", bias="bias1")
    if reason is not None:
        return reason
    bias = match.inputs["bias1"].meta["val"]
    weight = match.inputs["w1"].meta["val"]
    if bias.dtype != weight.dtype:
        return f"bias1 is {bias.dtype}, w1 {weight.dtype}"
    return None


PATTERNS = variants(search, replace, guard, name="deferred_conv_bias", exactness="exact", level="channels_last",
                    scalars=("d1", "d2"), residual_unit=(True, False),
                    module_types=("AliasFreeSnakeBeta", "CausalConv1d"))
