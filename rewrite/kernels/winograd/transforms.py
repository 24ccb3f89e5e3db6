"""Winograd F(2x2, 3x3): the transform matrices and the weight transform, in torch.

A 3x3 conv's 2x2 block of outputs from a 4x4 patch ``d`` of its input and the 3x3 filter ``g``:
``Y = A^T [(G g G^T) * (B^T d B)] A`` (elementwise product of two 4x4 matrices, 16 products where the direct conv
takes 36). Summed over input channels and temporal taps, the 16 products of each point become 16 GEMMs of
K = taps x channels, which is what `rewrite.kernels.winograd.winograd` computes.

The weight transform runs once per weight (the decoder's weights are constant while a module is optimized), in
fp32, and is rounded to the activations' dtype: the arithmetic whose accuracy issue 40 measured against the
`channels_last` contract (transforms in fp32, transformed operands in bf16, fp32 sums, fp32 output transform).
"""

from __future__ import annotations

import torch
from torch import Tensor

#: input transform B^T (rows: the 4 points of one dimension; columns: the 4 input positions of the patch)
INPUT_TRANSFORM = ((1.0, 0.0, -1.0, 0.0), (0.0, 1.0, 1.0, 0.0), (0.0, -1.0, 1.0, 0.0), (0.0, 1.0, 0.0, -1.0))
#: filter transform G (rows: the 4 points; columns: the 3 filter taps)
FILTER_TRANSFORM = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))
#: output transform A^T (rows: the 2 outputs; columns: the 4 points)
OUTPUT_TRANSFORM = ((1.0, 1.0, 1.0, 0.0), (0.0, 1.0, -1.0, -1.0))

POINTS = 16  # 4 x 4 products per 2x2 output block


def _filter_points(weight: Tensor, dim: int) -> Tensor:
    """G applied along `dim` (3 filter taps -> 4 points), by its rows' sums rather than a product with a constant:
    no host-to-device copy, so the transform may be captured in a CUDA graph."""
    first, middle, last = weight.unbind(dim)
    return torch.stack((first, (first + middle + last) * 0.5, (first - middle + last) * 0.5, last), dim)


def transformed_weight(weight: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``G g G^T`` of every (output channel, input channel, temporal tap) of a [O, C, kt, 3, 3] conv weight, as
    the GEMMs' right operand [16, kt * C, O] (point-major, then tap-major, output channels contiguous) in `dtype`
    (default: the weight's). Computed in fp32 (fp64 for an fp64 weight), with `FILTER_TRANSFORM`'s entries."""
    if weight.dim() != 5 or tuple(weight.shape[3:]) != (3, 3):
        raise ValueError(f"transformed_weight: expected a [O, C, kt, 3, 3] conv weight, got {tuple(weight.shape)}")
    compute = torch.float64 if weight.dtype == torch.float64 else torch.float32
    out_channels, in_channels, taps = weight.shape[:3]
    u = _filter_points(_filter_points(weight.to(compute), 3), 4)  # [O, C, kt, 4, 4]
    return u.permute(3, 4, 2, 1, 0).reshape(POINTS, taps * in_channels, out_channels).to(dtype or weight.dtype) \
        .contiguous()
