"""Winograd F(2x2, 3x3) and F(4x4, 3x3): the transform matrices and the weight transforms, in torch
(`weight_points` computes F(4x4, 3x3)'s on CUDA by Triton kernels, to the same bits).

A 3x3 conv's 2x2 block of outputs from a 4x4 patch ``d`` of its input and the 3x3 filter ``g``:
``Y = A^T [(G g G^T) * (B^T d B)] A`` (elementwise product of two 4x4 matrices, 16 products where the direct conv
takes 36). Summed over input channels and temporal taps, the 16 products of each point become 16 GEMMs of
K = taps x channels, which is what `rewrite.kernels.winograd.winograd` computes.

The weight transform runs once per weight (the decoder's weights are constant while a module is optimized), in
fp32, and is rounded to the activations' dtype: the arithmetic whose accuracy issue 40 measured against the
`channels_last` contract (transforms in fp32, transformed operands in bf16, fp32 sums, fp32 output transform).
"""

from __future__ import annotations

from typing import Optional

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


# ---- F(4x4, 3x3) ------------------------------------------------------------------------------------------------
# A 4x4 block of outputs from a 6x6 patch: 36 products where the direct conv takes 144 (4x fewer; F(2x2, 3x3):
# 2.25x). Interpolation points 0, 1, -1, 2, -1/2 and infinity: of the sets tried (docs/tuning.md 1.25) the one with
# the smallest error per layer. Its products are formed from fp16 operands, not bf16: with bf16 operands one layer's
# error against float64 was 36 dB (F(2x2, 3x3)'s 48, the direct conv's own bf16 output rounding 56), with fp16
# operands 52 dB (docs/data/experiments/winograd_tile_accuracy_cpu.py).
# B^T's rows are scaled to integers and G's rows by the inverse factors (a point's scale cancels in its product).
INPUT_TRANSFORM_4 = ((2.0, 3.0, -4.0, -3.0, 2.0, 0.0), (0.0, 2.0, 5.0, 1.0, -2.0, 0.0),
                     (0.0, 2.0, 1.0, -5.0, 2.0, 0.0), (0.0, -1.0, -2.0, 1.0, 2.0, 0.0),
                     (0.0, -2.0, 1.0, 2.0, -1.0, 0.0), (0.0, 2.0, 3.0, -4.0, -3.0, 2.0))
#: G's rows (the Vandermonde rows of the points) divided by the factors B^T's rows were multiplied by
_ROW_FACTORS_4 = (2.0, 6.0, 6.0, 30.0, 15.0 / 16.0, 2.0)
_VANDERMONDE_3 = ((1.0, 0.0, 0.0), (1.0, 1.0, 1.0), (1.0, -1.0, 1.0), (1.0, 2.0, 4.0), (1.0, -0.5, 0.25),
                  (0.0, 0.0, 1.0))
FILTER_TRANSFORM_4 = tuple(tuple(v / f for v in row) for row, f in zip(_VANDERMONDE_3, _ROW_FACTORS_4))
OUTPUT_TRANSFORM_4 = ((1.0, 1.0, 1.0, 1.0, 1.0, 0.0), (0.0, 1.0, -1.0, 2.0, -0.5, 0.0),
                      (0.0, 1.0, 1.0, 4.0, 0.25, 0.0), (0.0, 1.0, -1.0, 8.0, -0.125, 1.0))
POINTS_4 = 36
#: the largest |B^T d B| over a patch whose entries are at most 1 in magnitude: the largest product of two rows'
#: absolute sums (14 x 14); the input transform's scale keeps it inside fp16 with it
INPUT_GAIN_4 = 196.0
#: where the scaled operands' largest magnitude is put: half of fp16's largest finite value (65504), a factor 2
#: of room for the rounding of the bound the input's scale is computed from
FP16_TARGET = 32768.0


def power_of_two_at_most(limit: Tensor) -> Tensor:
    """The largest power of two at most `limit` (a positive tensor), clamped to [2^-60, 2^60]; zero, inf and NaN
    give the clamps' ends. Device ops only (a CUDA graph may capture them)."""
    exponent = torch.floor(torch.log2(limit.float())).nan_to_num(60.0, 60.0, -60.0).clamp(-60.0, 60.0)
    return torch.exp2(exponent)


#: the most bytes of fp32 points `transformed_weight_4` computes at once: a 1024 -> 1024 conv's whole
#: transform held 1.5 GB of fp32 temporaries beside its 226 MB result
TRANSFORM_CHUNK_BYTES = 64 * 1024 * 1024


def points_shape_4(weight: Tensor) -> tuple[int, int, int]:
    """The shape of F(4x4, 3x3)'s transformed weight, [36, kt * C, O], of a [O, C, kt, 3, 3] conv weight; a
    ValueError naming what was expected for any other weight."""
    if weight.dim() != 5 or tuple(weight.shape[3:]) != (3, 3):
        raise ValueError(f"transformed_weight_4: expected a [O, C, kt, 3, 3] conv weight, got {tuple(weight.shape)}")
    out_channels, in_channels, taps = weight.shape[:3]
    return POINTS_4, taps * in_channels, out_channels


def checked_outputs_4(weight: Tensor, out: Optional[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """`transformed_weight_4`'s argument checks (a [O, C, kt, 3, 3] weight; `out`, if given, contiguous fp16
    [36, kt * C, O] and fp32 [36] scales on the weight's device), and its outputs: `out`, or new tensors."""
    shape = points_shape_4(weight)
    if out is None:
        return (torch.empty(shape, dtype=torch.float16, device=weight.device),
                torch.empty(POINTS_4, dtype=torch.float32, device=weight.device))
    u_out, scales_out = out
    if tuple(u_out.shape) != shape or u_out.dtype != torch.float16 or tuple(scales_out.shape) != (POINTS_4,) \
            or scales_out.dtype != torch.float32 or not u_out.is_contiguous() \
            or u_out.device != weight.device or scales_out.device != weight.device:
        raise ValueError(f"transformed_weight_4: out must be contiguous fp16 {shape} and fp32 [{POINTS_4}] scales on "
                         f"{weight.device}, got {tuple(u_out.shape)} {u_out.dtype} on {u_out.device} and "
                         f"{tuple(scales_out.shape)} {scales_out.dtype} on {scales_out.device}")
    return u_out, scales_out


def transformed_weight_4(weight: Tensor, out: Optional[tuple[Tensor, Tensor]] = None,
                         chunk_bytes: int = TRANSFORM_CHUNK_BYTES) -> tuple[Tensor, Tensor]:
    """F(4x4, 3x3)'s ``G g G^T`` of a [O, C, kt, 3, 3] conv weight as fp16 [36, kt * C, O] (point-major, then
    tap-major, output channels contiguous), each point scaled by a power of two that puts its largest magnitude
    at `FP16_TARGET` (no overflow, no subnormals for a point's large entries), and those 36 scales (fp32). The
    transform runs in fp32 (fp64 for an fp64 weight), by `FILTER_TRANSFORM_4`'s rows; device ops only.

    The points are computed twice (the scales need every point's largest magnitude first), over blocks of output
    channels whose fp32 points take at most `chunk_bytes`: the same bits whatever the blocks (elementwise ops and a
    max). `out` (a tensor pair as this returns) receives the result in place: a kept transform is refreshed without
    a second copy. `weight_points.transformed_weight_4_on_device` computes the same bits by two Triton kernels."""
    u_out, scales_out = checked_outputs_4(weight, out)
    out_channels, in_channels, taps = weight.shape[:3]
    compute = torch.float64 if weight.dtype == torch.float64 else torch.float32
    block = max(1, chunk_bytes // (POINTS_4 * taps * in_channels * torch.finfo(compute).bits // 8))

    def rows(w: Tensor, dim: int) -> Tensor:
        first, middle, last = w.unbind(dim)
        return torch.stack([a * first + b * middle + c * last for a, b, c in FILTER_TRANSFORM_4], dim)

    def points(o0: int) -> Tensor:  # [36, kt * C, block] of output channels o0...
        g = weight[o0:o0 + block].to(compute)
        return rows(rows(g, 3), 4).permute(3, 4, 2, 1, 0).reshape(POINTS_4, taps * in_channels, -1)

    largest = torch.zeros(POINTS_4, dtype=compute, device=weight.device)
    for o0 in range(0, out_channels, block):
        largest = torch.maximum(largest, points(o0).abs().amax(dim=(1, 2)))
    scales_out.copy_(power_of_two_at_most(FP16_TARGET / largest.float()))
    for o0 in range(0, out_channels, block):
        u_out[:, :, o0:o0 + block] = points(o0) * scales_out.to(compute)[:, None, None]
    return u_out, scales_out


def input_scale_4(bound: Tensor) -> Tensor:
    """The power of two by which F(4x4, 3x3)'s input transform scales its values before rounding them to fp16,
    for an input whose magnitude is at most `bound` (a device scalar): at most `FP16_TARGET` after scaling."""
    return power_of_two_at_most(FP16_TARGET / (INPUT_GAIN_4 * bound.float().clamp_min(2.0 ** -60)))
