"""The fused alias-free activation feeding a causal conv1d (AuK's `act -> conv` pairs, 109 per decoder).

Matches:  y = rewrite::causal_conv1d(rewrite::alias_free_snake(x, alpha, beta, taps, True),
                                     weight, bias, dilation, residual)
          (after `alias_free_activation[fused]` and `causal_conv1d` fused their subgraphs; residual and bias
          each present or None: four variants)
Replaces: rewrite::alias_free_snake_causal_conv1d(x, alpha, beta, taps, True, weight, bias, dilation, residual)
          (rewrite.models.auk.alias_free): the activation kernel writes its output after the conv's zero pad in
          one buffer, so the pad no longer copies the activation (a fill and a copy per conv).
Exactness: tolerance, as the fused activation it contains. Against the two ops it replaces it is exact
          where the conv stays ATen's (the conv reads the same values in the same layout; torch.equal in the
          tests); where `rewrite.kernels.conv1d.conv1d.chosen` picks the Triton TF32 conv over a channels-last
          activation it is within that conv's TF32 tolerance (tests/models/auk/test_alias_free.py states the bound).
Level: channels_last (the only level with the fused activation).
Guard: x is [B, C, T] and the dilation one value.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.auk import alias_free as _fused_op  # noqa: F401  (registers the rewrite::alias_free_* ops)
from rewrite.models.auk import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.causal_conv1d)

rewrite_ops = torch.ops.rewrite


def _activation(x, alpha, beta, taps):
    return rewrite_ops.alias_free_snake.default(x, alpha, beta, taps, True)


def search(x, alpha, beta, taps, weight, bias, residual, dilation):
    return rewrite_ops.causal_conv1d.default(_activation(x, alpha, beta, taps), weight, bias, dilation, residual)


def replace(x, alpha, beta, taps, weight, bias, residual, dilation):
    return rewrite_ops.alias_free_snake_causal_conv1d.default(x, alpha, beta, taps, True, weight, bias, dilation, residual)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    if x.dim() != 3:
        return f"x {tuple(x.shape)} is not [B, C, T]"
    if len(match.scalars["dilation"]) != 1:
        return f"dilation {match.scalars['dilation']} is not one value"
    return None


PATTERNS = variants(search, replace, guard, name="snake_causal_conv1d", exactness="tolerance", level="channels_last",
                    scalars=("dilation",), optional=("residual", "bias"),
                    module_types=("AliasFreeSnakeBeta", "CausalConv1d"))
