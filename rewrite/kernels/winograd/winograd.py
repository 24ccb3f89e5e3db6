"""A 3x3 (x kt) conv3d over a pre-padded channels-last input by Winograd F(2x2, 3x3), in Triton: the public entry.

Computes what `rewrite.kernels.conv3d.conv3d.conv3d_channels_last` computes, for kernels [O, C, kt, 3, 3]::

    out[b, o, t, h, w] = sum_{i, j, k, c} weight[o, c, i, j, k] * padded[b, c, t + i, h + j, w + k]
                         (+ bias[o]) (+ residual[b, o, t, h, w])

with 16 products per 2x2 block of outputs and (channel, tap) where the direct conv takes 36 (`transforms`).
Exactness: tolerance (level ``channels_last`` only). The input transform runs in fp32 on the loaded pixels and
its result is rounded to the activation dtype, the weight comes transformed in that dtype (`transformed_weight`),
the 16 GEMMs accumulate in fp32 and the output transform, bias and residual are applied in fp32 before one
rounding: the arithmetic issue 40 measured against the `channels_last` contract. fp32 activations are computed
at IEEE precision under the interpreter only (CPU tests); on a GPU they are refused (`unsupported_reason`: the
fp32 decoders keep their exact ops).

F(2x2, 3x3) in two forms (`WinogradTile.materialized`): `fused` computes the input transform in its operand loads (one
kernel, no temporary), `materialized` writes it to memory first and runs plain pipelined TMA GEMMs over it (two kernels,
a temporary of 4x the padded input). Both keep five fp32 accumulators: a point's GEMM sum and the block's four outputs,
into which each point's sum is added with the output transform's coefficients.

F(4x4, 3x3) (`WinogradTile.output_block` 4, `large_tile`): 36 products per 4x4 block, fp16 operands with
power-of-two scales, the split form's three kernels; its entry is `large_tile.large_tile_conv3d` (its own weight
transform and a bound on the input's magnitude), or `winograd_conv3d` with such a tile.

Routed by `rewrite.models.wan.ops_fast.rms_norm_causal_conv3d_fast` where `chosen` (a per-card table, filled from
the GPU sweep `python -m rewrite.tools.sweep_winograd` once a full decode has measured the entry) names a tile for
the conv; `common.UNMEASURED_CANDIDATES` holds sweep winners waiting for that measurement. Not here yet: the
direct conv's epilogues beyond bias and residual (the next norm into the next conv's padded input).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rewrite.kernels.winograd import fused, large_tile, materialized
from rewrite.kernels.winograd.common import GPU_DTYPES, WinogradTile, chosen, unsupported_reason
from rewrite.kernels.winograd.transforms import transformed_weight, transformed_weight_4

__all__ = ["GPU_DTYPES", "WinogradTile", "chosen", "unsupported_reason", "winograd_conv3d",
           "winograd_conv3d_channels_last"]


def winograd_conv3d_channels_last(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                                  out: Tensor, tile: Optional[WinogradTile] = None) -> Tensor:
    """``conv3d(padded, weight, bias) (+ residual)`` into `out` ([B, O, T, H, W] of the unpadded conv, any strides,
    the activation dtype); returns `out`. `padded` must be channels-last (NDHWC) contiguous; `weight` is
    `transformed_weight` of the [O, C, kt, 3, 3] conv weight ([16, kt*C, O]), in the activation dtype; `tile`
    (default `WinogradTile()`) picks the form and its blocks."""
    tile = tile or WinogradTile()
    if tile.output_block != 2:
        raise ValueError(f"winograd_conv3d_channels_last: a tile of output block {tile.output_block}; this entry "
                         f"serves F(2x2, 3x3) (block 2); F(4x4, 3x3) takes its own transformed weight and an input "
                         f"bound: large_tile.large_tile_conv3d")
    form = materialized.materialized_conv3d if tile.materialized else fused.fused_conv3d
    return form(padded, weight, bias, residual, out, tile)


def winograd_conv3d(padded: Tensor, weight: Tensor, bias: Optional[Tensor] = None, residual: Optional[Tensor] = None,
                    tile: Optional[WinogradTile] = None) -> Tensor:
    """`winograd_conv3d_channels_last` from a plain [O, C, kt, 3, 3] weight into a new channels-last output: the
    convenience form for tests and sweeps (an op transforms its weight once and keeps it)."""
    padded = padded.contiguous(memory_format=torch.channels_last_3d)
    batch, _, tp, hp, wp = padded.shape
    shape = (batch, weight.shape[0], tp - weight.shape[2] + 1, hp - 2, wp - 2)
    out = torch.empty(shape, dtype=padded.dtype, device=padded.device, memory_format=torch.channels_last_3d)
    if tile is not None and tile.output_block == 4:  # the input's own magnitude as its bound
        u, point_scales = transformed_weight_4(weight)
        return large_tile.large_tile_conv3d(padded, u, point_scales, padded.abs().amax(), bias, residual, out, tile)
    return winograd_conv3d_channels_last(padded, transformed_weight(weight, padded.dtype), bias, residual, out, tile)
