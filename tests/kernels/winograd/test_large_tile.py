"""Winograd F(4x4, 3x3) (`rewrite.kernels.winograd.large_tile`): against the conv in float64 on small odd shapes
(under the interpreter on CPU, on CUDA where there is one), its power-of-two scales, its arguments, the transforms.

Tolerance, derived rather than fitted, as test_winograd.py derives F(2x2, 3x3)'s. Every output is a sum of terms
coef * x * g, coef the product of the transforms' entries along the term's path. Along one path the kernels perform
at most n = K + 40 fp32 operations (K = kt * C GEMM terms; the input transform a product and four additions per
side, 10; the weight transform's coefficients, themselves rounded to fp32, a product and two additions per side,
8; the output transform a product and five additions per side, 12; bias and residual 2; the scales are powers of
two and round nothing; 8 more counted for margin), so the fp32 result is within gamma_n * S of the exact value,
gamma_n = n u / (1 - n u), u = 2**-24, S the same computation on magnitudes (`_magnitudes`). The transformed input
and weight are each rounded once to fp16 whatever the activation dtype (u16 = 2**-11: 2 u16 + u16**2 more on every
term, valid while neither lands among fp16's subnormals: the scales put each one's largest magnitude at 2**15 and
these cases' values are within 2**10 of it) and the output once to its dtype (u_out |y|).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewrite.kernels.winograd import large_tile
from rewrite.kernels.winograd.common import WinogradTile
from rewrite.kernels.winograd.transforms import (FILTER_TRANSFORM_4, FP16_TARGET, INPUT_TRANSFORM_4,
                                                 OUTPUT_TRANSFORM_4, POINTS_4, input_scale_4, power_of_two_at_most,
                                                 transformed_weight_4)
from rewrite.kernels.winograd.weight_points import kernels_serve, transformed_weight_4_on_device
from rewrite.ops.dispatch import INTERPRETING
from tests import quick
from tests.kernels.winograd import test_winograd
from tests.kernels.winograd.test_winograd import UNIT_ROUNDING, _padded

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")
CL = torch.channels_last_3d
TILE = WinogradTile(16, 16, 8, 4, 1, True, 0, False, True, 4)  # small blocks: partial blocks everywhere
U16 = 2.0 ** -11


def _magnitudes(padded, weight, bias, residual):
    """S of the module docstring, in float64: the F(4x4, 3x3) computation on magnitudes."""
    return test_winograd._magnitudes(padded, weight, bias, residual, large_tile.BLOCK,
                                     (INPUT_TRANSFORM_4, FILTER_TRANSFORM_4, OUTPUT_TRANSFORM_4))


def _bound(padded, weight, bias, residual, exact, dtype, more_additions=0):
    """The module docstring's bound; `more_additions`: fp32 operations a caller adds on every path."""
    n = weight.shape[1] * weight.shape[2] + 40 + more_additions
    gamma = n * 2.0 ** -24 / (1 - n * 2.0 ** -24)
    return (gamma + 2 * U16 + U16 * U16) * _magnitudes(padded, weight, bias, residual) \
        + UNIT_ROUNDING[dtype] * exact.abs()


def _conv(padded, weight, bias=None, residual=None, bound=None, tile=TILE):
    """`large_tile_conv3d` into a new channels-last output, the weight transformed here, the bound the input's."""
    padded = padded.contiguous(memory_format=CL)
    batch, _, tp, hp, wp = padded.shape
    shape = (batch, weight.shape[0], tp - weight.shape[2] + 1, hp - 2, wp - 2)
    out = torch.empty(shape, dtype=padded.dtype, device=padded.device, memory_format=CL)
    u, scales = transformed_weight_4(weight)
    bound = padded.abs().amax() if bound is None else bound
    return large_tile.large_tile_conv3d(padded, u, scales, bound, bias, residual, out, tile)


CASES = {  # batch, in channels, out channels, output frames, height, width, cache, bias, residual, taps
    "one-frame-odd-plane": (1, 16, 16, 1, 5, 7, False, True, False, 3),        # sides not multiples of 4
    "three-frames-cache": (2, 24, 24, 3, 6, 9, True, True, True, 3),           # partial blocks, batch 2
    "one-column": (1, 16, 8, 1, 4, 1, True, False, True, 3),                  # a plane one pixel wide
    "wide-k": (1, 40, 24, 2, 8, 8, False, True, True, 3),                      # K = 3 channel blocks per tap
    "one-tap": (1, 16, 16, 2, 7, 6, False, False, False, 1),                   # a 1x3x3 kernel
}


@needs_kernels
@pytest.mark.parametrize("dtype,case", quick.product(
    {str(dtype): (dtype,) for dtype in (torch.float32, torch.bfloat16, torch.float16)},
    {name: (name,) for name in CASES}))
def test_large_tile_conv3d_is_within_its_derived_bound_of_the_exact_conv(dtype, case):
    if dtype == torch.float32 and not INTERPRETING:
        pytest.skip("fp32 is served only under the interpreter")
    batch, cin, cout, frames, height, width, cache, has_bias, has_residual, taps = CASES[case]
    generator = torch.Generator().manual_seed(0)
    padded = _padded(batch, cin, frames, height, width, cache, generator, taps).to(dtype)
    weight = (torch.randn(cout, cin, taps, 3, 3, generator=generator) / (9 * taps * cin) ** 0.5).to(dtype)
    bias = torch.randn(cout, generator=generator).to(dtype) if has_bias else None
    residual = torch.randn(batch, cout, frames, height, width, generator=generator).to(dtype) if has_residual else None
    exact = F.conv3d(padded.double(), weight.double(), None if bias is None else bias.double())
    if residual is not None:
        exact = exact + residual.double()
    actual = _conv(padded.to(DEVICE), weight.to(DEVICE), None if bias is None else bias.to(DEVICE),
                   None if residual is None else residual.to(DEVICE)).cpu()
    bound = _bound(padded, weight, bias, residual, exact, dtype)
    error = (actual.double() - exact).abs()
    assert actual.dtype == dtype and actual.is_contiguous(memory_format=CL)
    assert torch.all(error <= bound), f"worst error / bound {(error / bound).max().item():.3g}"


@needs_kernels
def test_inputs_past_fp16s_range_are_scaled_into_it():
    """Values of 2000 give transformed inputs up to 196 x 2000, past fp16's 65504: the input's power-of-two scale
    keeps them finite, and the result is as close, relative to its magnitude, as at unit scale."""
    generator = torch.Generator().manual_seed(3)
    padded = _padded(1, 16, 2, 6, 6, True, generator).bfloat16()
    weight = (torch.randn(16, 16, 3, 3, 3, generator=generator) / (27 * 16) ** 0.5).bfloat16()
    unit = _conv(padded.to(DEVICE), weight.to(DEVICE)).cpu()
    large = _conv((padded * 2048.0).to(DEVICE), weight.to(DEVICE)).cpu()
    assert torch.isfinite(large).all()
    assert torch.equal(large, unit * 2048.0)  # a power of two through every step: the same roundings, scaled


def test_the_transforms_give_the_direct_filters_product():
    """One 6x6 input patch: A^T [(G g G^T) * (B^T d B)] A equals the valid 3x3 conv of d (4x4), in float64; the
    scaled weight's points times their inverse scales give G g G^T."""
    generator = torch.Generator().manual_seed(2)
    d = torch.randn(6, 6, generator=generator, dtype=torch.float64)
    g = torch.randn(1, 1, 1, 3, 3, generator=generator, dtype=torch.float64)
    u, scales = transformed_weight_4(g)
    assert u.shape == (POINTS_4, 1, 1) and u.dtype == torch.float16 and scales.shape == (POINTS_4,)
    assert u.double().abs().view(-1).max() <= FP16_TARGET
    bt, gt, at = (torch.tensor(m, dtype=torch.float64) for m in (INPUT_TRANSFORM_4, FILTER_TRANSFORM_4,
                                                                 OUTPUT_TRANSFORM_4))
    exact_u = gt @ g.view(3, 3) @ gt.T
    y = at @ (exact_u * (bt @ d @ bt.T)) @ at.T
    direct = F.conv2d(d.view(1, 1, 6, 6), g.view(1, 1, 3, 3)).view(4, 4)
    assert torch.allclose(y, direct, rtol=0, atol=1e-12)  # float64 rounding of 36 short sums: far below 1e-12
    # the kept points: exact_u rounded once to fp16 after a power-of-two scale (relative error at most 2**-11)
    assert torch.all((u.double().view(6, 6) / scales.double().view(6, 6) - exact_u).abs()
                     <= U16 * exact_u.abs() + 1e-300)


def _outputs_like(u: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full_like(u, float("nan")), torch.zeros_like(scales)


def test_the_torch_weight_transform_by_blocks_of_channels_is_the_whole_one_and_writes_in_place():
    """`transformed_weight_4` over one-channel blocks (a 1-byte budget) gives the bits of one block, into `out`."""
    weight = torch.randn(5, 3, 2, 3, 3, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    weight[3] *= 1000.0  # one output channel sets some points' scales: every block must see it
    whole = transformed_weight_4(weight, chunk_bytes=1 << 30)
    out = _outputs_like(*whole)
    u, scales = transformed_weight_4(weight, out, chunk_bytes=1)
    assert u is out[0] and scales is out[1]
    assert torch.equal(u, whole[0]) and torch.equal(scales, whole[1])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_the_weight_transform_kernels_give_the_torch_paths_bits(dtype):
    """`weight_points`' two kernels against `transformed_weight_4` (torch), bit for bit: odd channel counts
    (partial programs both ways), a channels-last weight (its strides read as given), one channel far larger (the
    scales)."""
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(37, 5, 3, 3, 3, generator=generator)
    weight[20] *= 300.0
    weight = weight.to(dtype).contiguous(memory_format=CL)
    expected = transformed_weight_4(weight)
    assert kernels_serve(weight.to(DEVICE))
    out = tuple(t.to(DEVICE) for t in _outputs_like(*expected))
    u, scales = transformed_weight_4_on_device(weight.to(DEVICE), out)
    assert u is out[0] and scales is out[1]
    assert torch.equal(u.cpu(), expected[0]) and torch.equal(scales.cpu(), expected[1])


@pytest.mark.parametrize("transform", [transformed_weight_4, transformed_weight_4_on_device],
                         ids=["torch", "on_device"])
def test_bad_transform_outputs_raise_errors_naming_what_was_expected(transform):
    weight = torch.zeros(4, 2, 1, 3, 3)
    u, scales = transformed_weight_4(weight)
    with pytest.raises(ValueError, match="out must be contiguous fp16"):
        transform(weight, (u.float(), scales))
    with pytest.raises(ValueError, match="fp32"):
        transform(weight, (u, scales.double()))
    with pytest.raises(ValueError, match="contiguous"):
        transform(weight, (u.transpose(1, 2).contiguous().transpose(1, 2), scales))
    with pytest.raises(ValueError, match="conv weight"):
        transform(torch.zeros(4, 2, 1, 5, 5))


def test_the_scales_are_powers_of_two_that_keep_fp16_finite():
    limits = torch.tensor([3.0, 1.0, 0.75, 2.0 ** 70, 0.0, float("inf")])
    scales = power_of_two_at_most(limits)
    assert scales.tolist() == [2.0, 1.0, 0.5, 2.0 ** 60, 2.0 ** -60, 2.0 ** 60]
    bound = torch.tensor(10.0)
    scale = input_scale_4(bound)
    assert scale * 196.0 * bound <= FP16_TARGET < 2 * scale * 196.0 * bound


def test_bad_arguments_raise_errors_naming_what_was_expected():
    padded = torch.zeros(1, 16, 3, 6, 6).contiguous(memory_format=CL)
    weight, scales = transformed_weight_4(torch.zeros(8, 16, 3, 3, 3))
    out = torch.empty(1, 8, 1, 4, 4)
    bound = torch.tensor(1.0)
    with pytest.raises(ValueError, match="transformed_weight_4's fp16"):
        large_tile.large_tile_conv3d(padded, weight.float(), scales, bound, None, None, out, TILE)
    with pytest.raises(ValueError, match=r"point_scales must be \[36\]"):
        large_tile.large_tile_conv3d(padded, weight, scales[:16], bound, None, None, out, TILE)
    with pytest.raises(ValueError, match="channels-last"):
        large_tile.large_tile_conv3d(padded.contiguous(), weight, scales, bound, None, None, out, TILE)
    with pytest.raises(ValueError, match=r"out must be \(1, 8, 1, 4, 4\)"):
        large_tile.large_tile_conv3d(padded, weight, scales, bound, None, None, torch.empty(1, 8, 1, 4, 5), TILE)
    with pytest.raises(ValueError, match="expected a"):
        transformed_weight_4(torch.zeros(8, 16, 3, 5, 5))


@needs_kernels
def test_bands_of_rows_bound_the_temporaries_and_keep_the_result(monkeypatch):
    """With room for one block row of temporaries at a time, the conv runs band by band (views of the input, the
    output and the residual) and stays within the derived bound; the band sizes follow the budget."""
    generator = torch.Generator().manual_seed(4)
    padded = _padded(2, 16, 2, 11, 9, True, generator).to(torch.bfloat16)  # 3 block rows, the last one short
    weight = (torch.randn(8, 16, 3, 3, 3, generator=generator) / (27 * 16) ** 0.5).to(torch.bfloat16)
    bias = torch.randn(8, generator=generator).to(torch.bfloat16)
    residual = torch.randn(2, 8, 2, 11, 9, generator=generator).to(torch.bfloat16)
    per_row = 36 * 2 * 3 * (4 * 16 * 2 + 2 * 8 * 4)  # 36 points x batch x 3 block columns x (V + sums) bytes
    assert large_tile.band_rows(padded.shape, 8, 2) == 3  # the default budget holds all rows
    monkeypatch.setattr(large_tile, "TEMPORARY_BYTES", per_row)
    assert large_tile.band_rows(padded.shape, 8, 2) == 1
    launches = []
    transform = large_tile.input_transform
    monkeypatch.setattr(large_tile, "input_transform", lambda p, *a: launches.append(p.shape[3]) or transform(p, *a))
    exact = F.conv3d(padded.double(), weight.double(), bias.double()) + residual.double()
    actual = _conv(padded.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), residual.to(DEVICE)).cpu()
    assert launches == [6, 6, 5]  # padded rows per band: 4 + 2, 4 + 2, the last band's 3 + 2
    error = (actual.double() - exact).abs()
    bound = _bound(padded, weight, bias, residual, exact, torch.bfloat16)
    assert torch.all(error <= bound), f"worst error / bound {(error / bound).max().item():.3g}"


def _routed_shapes() -> dict[tuple[int, int, int], WinogradTile]:
    """(in channels, out channels, width) -> tile of every F(4x4, 3x3) entry in any card's routed table."""
    from rewrite.kernels.winograd import common

    return {(cin, cout, width): tile for table in common._MEASURED_FASTER.values()
            for (cin, cout, width, _), tile in table.items() if tile.output_block == 4}


def _check_shape(cin, cout, width, tile, dtype, device, height=12, frames=2):
    """The conv at a routed shape (its channels, width and tile; `height` rows: three block rows) with cache, bias
    and residual, against the float64 conv on `device`, within the module docstring's bound."""
    generator = torch.Generator().manual_seed(cin + cout + width)
    padded = _padded(1, cin, frames, height, width, True, generator).to(dtype).to(device)
    weight = (torch.randn(cout, cin, 3, 3, 3, generator=generator) / (27 * cin) ** 0.5).to(dtype).to(device)
    bias = torch.randn(cout, generator=generator).to(dtype).to(device)
    residual = torch.randn(1, cout, frames, height, width, generator=generator).to(dtype).to(device)
    exact = F.conv3d(padded.double(), weight.double(), bias.double()) + residual.double()
    actual = _conv(padded, weight, bias, residual, tile=tile)
    error = (actual.double() - exact).abs()
    bound = _bound(padded, weight, bias, residual, exact, dtype)
    assert torch.all(error <= bound), f"{cin} -> {cout} at {width} wide, {dtype}: worst error / bound " \
                                      f"{(error / bound).max().item():.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
def test_every_routed_shape_is_within_its_derived_bound(dtype):
    """Issue 40's per-layer GPU test: every Wan conv a card's table routes to F(4x4, 3x3), at its channels, width
    and tile (the CPU cases above use small tiles), in bf16 and fp16."""
    shapes = _routed_shapes()
    assert shapes, "no F(4x4, 3x3) entry in any card's table"
    for (cin, cout, width), tile in sorted(shapes.items()):
        _check_shape(cin, cout, width, tile, dtype, torch.device("cuda"))
