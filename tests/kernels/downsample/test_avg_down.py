"""The AvgDown3D shortcut-add kernel (`rewrite.kernels.downsample.avg_down`) under the Triton interpreter (and on
CUDA): `torch.equal` to its documented arithmetic (each group summed into four fp32 partial sums, the sums added
left to right, scaled, rounded, added to main) emulated by torch ops, for Wan 2.2's factors and groups, the pad in
front, every dtype and the layouts the encoder hands it; the output in the layout ATen's add gives; bad shapes
refused by name."""

from __future__ import annotations

import pytest
import torch

from rewrite.kernels.downsample import avg_down as triton_avg_down
from tests.kernels.norm.test_rms_norm import DEVICE, DTYPES, needs_kernels
from tests.op_cases import LAYOUTS, frame_major

# (factor_t, factor_s, group, pad_t, x channels): Wan 2.2's four down blocks (group 2, 4, 8 and the unfactored 1),
# the temporal ones also with chunk 0's frame of padding
CASES = [(1, 2, 2, 0, 4), (2, 2, 4, 0, 4), (2, 2, 4, 1, 4), (2, 2, 8, 0, 8), (2, 2, 8, 1, 8), (1, 1, 1, 0, 4)]


def _grouped(x, pad_t, factor_t, factor_s, group):
    """The shortcut's values before the mean, [B, O, group, T', H', W'] (data movement: exact in any dtype)."""
    x = torch.nn.functional.pad(x, (0, 0, 0, 0, pad_t, 0))
    b, c, t, h, w = x.shape
    unfolded = x.view(b, c, t // factor_t, factor_t, h // factor_s, factor_s, w // factor_s, factor_s)
    unfolded = unfolded.permute(0, 1, 3, 5, 7, 2, 4, 6).contiguous()
    return unfolded.view(b, c * factor_t * factor_s * factor_s // group, group, t // factor_t, h // factor_s,
                         w // factor_s)


def _emulated(main, x, pad_t, factor_t, factor_s, group):
    grouped = _grouped(x, pad_t, factor_t, factor_s, group).float()
    sums = [torch.zeros_like(grouped[:, :, 0]) for _ in range(4)]
    for g in range(group):
        sums[g % 4] = sums[g % 4] + grouped[:, :, g]
    mean = ((((sums[0] + sums[1]) + sums[2]) + sums[3]) * (1.0 / group)).to(x.dtype)
    return (main.float() + mean.float()).to(main.dtype)


def _operands(case, dtype, main_layout, x_layout, seed=0):
    factor_t, factor_s, group, pad_t, c = case
    g = torch.Generator().manual_seed(seed)
    frames = 4 - pad_t
    # magnitudes from 1e-3 to 1e3, so that the order of the sums shows in the low bits
    scale = 10.0 ** torch.randint(-3, 4, (2, c, frames, 6, 10), generator=g)
    x = LAYOUTS[x_layout]((torch.randn(2, c, frames, 6, 10, generator=g) * scale).to(DEVICE, dtype))
    shape = triton_avg_down.avg_down_shape(x.shape, pad_t, factor_t, factor_s, group)
    main = LAYOUTS[main_layout](torch.randn(shape, generator=g).to(DEVICE, dtype))
    return main, x


@needs_kernels
@pytest.mark.parametrize("case", CASES, ids=lambda c: "ft{}_fs{}_g{}_pad{}_c{}".format(*c))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_kernel_is_its_documented_arithmetic(case, dtype):
    main, x = _operands(case, dtype, "frame_major", "contiguous")
    factors = case[3], case[0], case[1], case[2]
    actual = triton_avg_down.avg_down_add(main, x, *factors)
    assert torch.equal(actual, _emulated(main, x, *factors))
    reference = main + _grouped(x, *factors).mean(dim=2)
    assert actual.stride() == reference.stride()  # the layout ATen's add gives


@needs_kernels
@pytest.mark.parametrize("main_layout", ("contiguous", "frame_major", "channels_last"))
@pytest.mark.parametrize("x_layout", ("contiguous", "frame_major", "channels_last"))
def test_any_layout_in_the_layout_atens_add_gives_out(main_layout, x_layout):
    case = (2, 2, 8, 1, 8)
    main, x = _operands(case, torch.bfloat16, main_layout, x_layout, seed=1)
    factors = case[3], case[0], case[1], case[2]
    actual = triton_avg_down.avg_down_add(main, x, *factors)
    reference = main + _grouped(x, *factors).mean(dim=2)
    assert torch.equal(actual, _emulated(main, x, *factors)) and actual.stride() == reference.stride()


@pytest.mark.parametrize("main_shape,x_shape,factors,match", [
    ((2, 8, 2, 3, 5), (2, 4, 4, 6, 10, 1), (0, 2, 2, 4), "6-D"),
    ((2, 8, 2, 3, 5), (2, 4, 3, 6, 10), (0, 2, 2, 4), "does not unfold"),
    ((2, 8, 2, 3, 5), (2, 4, 4, 6, 10), (0, 2, 2, 16), "at most 8"),
    ((2, 8, 2, 3, 4), (2, 4, 4, 6, 10), (0, 2, 2, 4), r"is not the shortcut's \(2, 8, 2, 3, 5\)"),
])
def test_shapes_it_does_not_serve_are_refused_by_name(main_shape, x_shape, factors, match):
    main, x = torch.zeros(main_shape), torch.zeros(x_shape)
    with pytest.raises(ValueError, match=match):
        triton_avg_down.avg_down_add(main, x, *factors)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("c,frames,h,w,factor_t,factor_s,out,pad_t", [
    (160, 4, 352, 640, 1, 2, 320, 0),  # Wan 2.2's 704x1280 encode, steady step: down blocks 0-2 (groups 2, 4, 8)
    (320, 4, 176, 320, 2, 2, 640, 0),
    (640, 2, 88, 160, 2, 2, 640, 0),
    (640, 1, 88, 160, 2, 2, 640, 1),   # chunk 0: one frame padded by one
    (16, 4, 8, 12, 1, 2, 32, 0),       # small planes: few outputs, where ATen could share a reduction out
    (32, 1, 4, 6, 2, 2, 32, 1),
])
def test_gpu_the_kernel_is_atens_shortcut_and_add(dtype, c, frames, h, w, factor_t, factor_s, out, pad_t):
    """The order of ATen's CUDA mean is the one it runs: `torch.equal` to diffusers' AvgDown3D and the add at the
    encoder's full-size shapes and at small ones (what the pattern's ``lossless`` level rests on)."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import AvgDown3D

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(1, c, frames, h, w, generator=g) * 3).to("cuda", dtype)
    module = AvgDown3D(c, out, factor_t, factor_s)
    shape = triton_avg_down.avg_down_shape(x.shape, pad_t, factor_t, factor_s, module.group_size)
    main = frame_major(torch.randn(shape, generator=g).to("cuda", dtype))  # as the downsamplers leave it
    expected = main + module(x)
    actual = triton_avg_down.avg_down_add(main, x, pad_t, factor_t, factor_s, module.group_size)
    assert actual.stride() == expected.stride()
    assert torch.equal(actual, expected), (actual.float() - expected.float()).abs().max().item()
