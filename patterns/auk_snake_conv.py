"""The fused alias-free activation feeding a causal conv1d (AuK's `act -> conv` pairs, 109 per decoder).

Matches:  y = rewrite::causal_conv1d(rewrite::alias_free_snake(x, alpha, beta, taps, True),
                                     weight, bias, dilation, residual)
          (after `alias_free_activation[fused]` and `causal_conv1d` fused their subgraphs; bias and residual
          each present or None: four variants)
Replaces: rewrite::alias_free_snake_causal_conv1d(x, alpha, beta, taps, True, weight, bias, dilation, residual)
          (rewrite.ops.alias_free): the activation kernel writes its output after the conv's zero pad in
          one buffer, so the pad no longer copies the activation (a fill and a copy per conv).
Exactness: tolerance, as the fused activation it contains; against the two ops it replaces it is exact
          (the conv reads the same values in the same layout), checked with torch.equal in the tests.
Level: channels_last (the only level with the fused activation).
Guard: x is [B, C, T] and the dilation one value.
"""

from __future__ import annotations

import dataclasses

import torch

from rewrite.engine.pattern import variants
from rewrite.ops import alias_free as _fused_op  # noqa: F401  (registers the rewrite::alias_free_* ops)
from rewrite.ops import auk as _ops  # noqa: F401  (registers torch.ops.rewrite.causal_conv1d)

rewrite_ops = torch.ops.rewrite


def _activation(x, alpha, beta, taps):
    return rewrite_ops.alias_free_snake.default(x, alpha, beta, taps, True)


def search(x, alpha, beta, taps, weight, bias, residual, dilation):
    return rewrite_ops.causal_conv1d.default(_activation(x, alpha, beta, taps), weight, bias, dilation, residual)


def replace(x, alpha, beta, taps, weight, bias, residual, dilation):
    return rewrite_ops.alias_free_snake_causal_conv1d.default(x, alpha, beta, taps, True, weight, bias, dilation, residual)


def search_plain(x, alpha, beta, taps, weight, bias, dilation):
    return rewrite_ops.causal_conv1d.default(_activation(x, alpha, beta, taps), weight, bias, dilation, None)


def replace_plain(x, alpha, beta, taps, weight, bias, dilation):
    return rewrite_ops.alias_free_snake_causal_conv1d.default(x, alpha, beta, taps, True, weight, bias, dilation, None)


def search_no_bias(x, alpha, beta, taps, weight, residual, dilation):
    return rewrite_ops.causal_conv1d.default(_activation(x, alpha, beta, taps), weight, None, dilation, residual)


def replace_no_bias(x, alpha, beta, taps, weight, residual, dilation):
    return rewrite_ops.alias_free_snake_causal_conv1d.default(x, alpha, beta, taps, True, weight, None, dilation, residual)


def search_plain_no_bias(x, alpha, beta, taps, weight, dilation):
    return rewrite_ops.causal_conv1d.default(_activation(x, alpha, beta, taps), weight, None, dilation, None)


def replace_plain_no_bias(x, alpha, beta, taps, weight, dilation):
    return rewrite_ops.alias_free_snake_causal_conv1d.default(x, alpha, beta, taps, True, weight, None, dilation, None)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    if x.dim() != 3:
        return f"x {tuple(x.shape)} is not [B, C, T]"
    if len(match.scalars["dilation"]) != 1:
        return f"dilation {match.scalars['dilation']} is not one value"
    return None


def _named(search_fn, replace_fn, label: str):
    """One pattern named `snake_causal_conv1d[label]` (family `snake_causal_conv1d`)."""
    [pattern] = variants(search_fn, replace_fn, guard, name="snake_causal_conv1d", exactness="tolerance",
                         level="channels_last", scalars=("dilation",),
                         module_types=("AliasFreeSnakeBeta", "CausalConv1d"))
    return dataclasses.replace(pattern, name=f"snake_causal_conv1d[{label}]" if label else "snake_causal_conv1d")


PATTERNS = (
    _named(search, replace, "residual"),
    _named(search_no_bias, replace_no_bias, "residual, bias=None"),
    _named(search_plain, replace_plain, ""),
    _named(search_plain_no_bias, replace_plain_no_bias, "bias=None"),
)
