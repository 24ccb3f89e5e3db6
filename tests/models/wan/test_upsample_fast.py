"""The Wan upsamplers' conv by output phases (level ``channels_last``): the Triton phase kernels of Wan 2.1, the
cuDNN phase conv and its gathering epilogue of Wan 2.2, the two ops and their routing.

Tolerances (each test says which it checks): the kernels round an fp32 sum once (`tests.ulps.within_one_ulp`'s
bound); the summed 2x2 taps are rounded once to bf16, which moves each output by at most bf16's unit roundoff
(2**-8, relative) times the sum of |tap| * |x|; every further rounding of a bf16 result (the conv output, the bias
add, the shortcut add) adds at most 2**-8 of that result's magnitude.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.epilogue import epilogue as triton_epilogue
from rewrite.kernels.conv3d import phase_weights as triton_phase_weights
from rewrite.models.wan import upsample_fast as wan_upsample_fast
from rewrite.models.wan import ops as _wan_ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.ops.dispatch import INTERPRETING, use_backend
from rewrite.kernels.conv3d.conv3d import ConvTile
from tests.op_cases import frame_major
from tests.ulps import within_one_ulp

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")


# ---- Wan 2.1: the Triton phase kernels ------------------------------------------------------------------
@needs_kernels
@pytest.mark.parametrize("n,c,o,h,w,tile", [
    (2, 32, 16, 3, 5, ConvTile(32, 16, 16, 4, 2)),            # odd sizes, 2 frames
    (1, 16, 48, 4, 9, ConvTile(16, 32, 16, 4, 2, 16, 2)),     # 32 + 16 channels, two rows per program
])
def test_upsample_phases_match_the_conv_of_the_upsample(n, c, o, h, w, tile):
    """Each output phase is a 2x2 conv with summed weights: against the double conv of the upsampled x with
    the weights `phase_weights_reference` rounded (the kernel test's bound), and against the true weights
    with that rounding's error added (half a weight ulp per summed tap, times |x|)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(n, c, h, w, generator=g).to(torch.bfloat16).to(DEVICE)
    weight = (torch.randn(o, c, 3, 3, generator=g) / (9 * c) ** 0.5).to(torch.bfloat16).to(DEVICE)
    bias = torch.randn(o, generator=g).to(torch.bfloat16).to(DEVICE)
    out = torch.empty(n, o, 2 * h, 2 * w, dtype=torch.bfloat16, device=DEVICE)
    triton_conv3d.upsample2x_conv2d_channels_last(wan_upsample_fast.padded_source(x), weight, bias, out, config=tile)
    phases = triton_phase_weights.phase_weights_reference(weight).double()  # [4, O, C, 2, 2]
    source = F.pad(x.double(), (1, 1, 1, 1))
    reference = torch.empty(out.shape, dtype=torch.float64, device=DEVICE)
    magnitude = torch.empty_like(reference)
    for ph in (0, 1):
        for pw in (0, 1):
            window = source[:, :, ph:ph + h + 1, pw:pw + w + 1]
            reference[:, :, ph::2, pw::2] = F.conv2d(window, phases[2 * ph + pw], bias.double())
            magnitude[:, :, ph::2, pw::2] = (F.conv2d(window.abs(), phases[2 * ph + pw].abs())
                                             + bias.double().abs().view(-1, 1, 1))
    within_one_ulp(out.unsqueeze(2), reference.unsqueeze(2), magnitude.unsqueeze(2), 4 * c + 1)
    upsampled = F.interpolate(x.double(), scale_factor=2, mode="nearest")
    exact = F.conv2d(upsampled, weight.double(), bias.double(), padding=1)
    weight_rounding = 2.0 ** -8 * magnitude  # bf16's unit roundoff of each summed tap, relative
    assert bool(((out.double() - exact).abs() <= (out.double() - reference).abs() + weight_rounding).all())


@needs_kernels
def test_upsample_op_takes_the_phases_where_served(kernel_allowed_on_cpu, monkeypatch):
    monkeypatch.setattr(wan_upsample_fast, "_TRITON_PHASES_FASTER", frozenset({(16, 16)}))
    monkeypatch.setattr(triton_conv3d, "launch_config", lambda c, o, w=None, *_, **__: ConvTile(16, 16, 16, 4, 2))
    ran = []
    original = triton_conv3d.upsample2x_conv2d_channels_last
    monkeypatch.setattr(triton_conv3d, "upsample2x_conv2d_channels_last",
                        lambda *a, **k: ran.append(1) or original(*a, **k))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(16, 2, 3, 4, generator=g).to(torch.bfloat16).transpose(0, 1).to(DEVICE)  # NCDHW's frames
    weight = (torch.randn(16, 16, 3, 3, generator=g) / 12).to(torch.bfloat16).to(DEVICE)
    bias = torch.randn(16, generator=g).to(torch.bfloat16).to(DEVICE)
    fast = torch.ops.rewrite.upsample_conv2d_fast(x, True, weight, bias, [1, 1], [1, 1])
    with use_backend("reference"):
        exact = torch.ops.rewrite.upsample_conv2d(x, True, weight, bias, [1, 1], [1, 1])
    assert ran and fast.stride() == exact.stride()
    assert (fast.float() - exact.float()).abs().max().item() <= 2 * 2.0 ** -6  # 2 ulps of outputs below 4 (max 2.4)
    assert exact.abs().max().item() < 4


def test_upsample_reason_names_what_declines():
    reason = wan_upsample_fast.upsample_reason
    assert "3x3, 1, 1 served" in reason((1, 192, 8, 8), (96, 192, 3, 3), [2, 2], [1, 1], torch.bfloat16)
    assert "fp32 keeps cuDNN" in reason((1, 192, 8, 8), (96, 192, 3, 3), [1, 1], [1, 1], torch.float32)
    assert "not measured faster" in reason((1, 64, 8, 8), (32, 64, 3, 3), [1, 1], [1, 1], torch.bfloat16)
    assert reason((4, 192, 8, 8), (96, 192, 3, 3), [1, 1], [1, 1], torch.bfloat16) is None


# ---- the phase kernels' weights ----------------------------------------------------------------------------
@needs_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_phase_weights_kernel_is_the_reference(dtype, layout):
    """The one-pass kernel sums the taps in the reference's order and rounds once: `torch.equal`, in the
    [4, O, 2, 2, C] memory both phase convs read as channels-last views."""
    g = torch.Generator().manual_seed(8)
    weight = torch.randn(37, 300, 3, 3, generator=g).to(dtype).to(DEVICE)  # O * C past one program, odd sizes
    if layout == "channels_last":
        weight = weight.contiguous(memory_format=torch.channels_last)
    phases = triton_phase_weights.phase_weights(weight)
    assert torch.equal(phases, triton_phase_weights.phase_weights_reference(weight))
    assert phases.permute(0, 1, 3, 4, 2).is_contiguous()
    assert phases.flatten(0, 1).is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match=r"\[O, C, 3, 3\]"):
        triton_phase_weights.phase_weights(weight[:, :, :2])


# ---- Wan 2.2: the cuDNN phase conv, gathered by the DupUp epilogue -------------------------------------------
def _upsampled_conv(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """conv2d(upsample_nearest2x(x), weight, padding=1) in float64."""
    return F.conv2d(F.interpolate(x.double(), scale_factor=2, mode="nearest"), weight.double(), padding=1)


@needs_kernels
@pytest.mark.parametrize("layout", ["channels_last", "frames_of_ncdhw"])
def test_phase_conv_gathered_is_the_conv_of_the_upsample(layout):
    """`phase_conv` + the epilogue's phase gather against the conv of the upsampled x, in float32 (no rounded
    taps: the summed taps and the conv are fp32, so only the summation order differs: 1e-5 relative to the
    sum of |terms|, 36 terms of fp32 rounding at most 36 * 2**-24 ~ 2e-6)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(16, 3, 5, 7, generator=g).transpose(0, 1).to(DEVICE)  # the frames of an NCDHW tensor
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    weight = (torch.randn(8, 16, 3, 3, generator=g) / 12).to(DEVICE)
    y = wan_upsample_fast.phase_conv(x, weight)
    assert tuple(y.shape) == (3, 32, 6, 8)
    out = triton_epilogue.conv_epilogue(y.unsqueeze(2), None, None, (1120, 140, 1120, 14, 1), phases=True)
    magnitude = F.conv2d(F.interpolate(x.double().abs(), scale_factor=2, mode="nearest"), weight.double().abs(),
                         padding=1)
    error = (out.squeeze(2).double() - _upsampled_conv(x, weight)).abs()
    assert bool((error <= 1e-5 * magnitude + 1e-7).all()), error.max()


def test_phase_epilogue_rejects_what_is_not_a_phase_conv():
    with pytest.raises(ValueError, match=r"4 \* C"):
        triton_epilogue.conv_epilogue(torch.zeros(1, 6, 1, 3, 3), None, None, (36, 9, 9, 3, 1), phases=True)


def _dup_up_case(first_frame: int, dx_layout: str, seed: int = 7):
    """Operands of a Wan 2.2 up-block end (16 -> 16 channels, 2x in time and space) in bf16: the upsampler's
    frames x, the block input dx whose DupUp3D shortcut is added."""
    g = torch.Generator().manual_seed(seed)
    cin, cout, ft, fs, t, h, w = 16, 16, 2, 2, 2, 3, 4
    frames = t * ft - first_frame
    dx = torch.randn(1, cin, t, h, w, generator=g).to(torch.bfloat16)
    dx = frame_major(dx) if dx_layout == "frame_major" else dx
    x = torch.randn(cin, frames, h, w, generator=g).to(torch.bfloat16).transpose(0, 1)
    weight = (torch.randn(cout, cin, 3, 3, generator=g) / 12).to(torch.bfloat16)
    bias = torch.randn(cout, generator=g).to(torch.bfloat16)
    scalars = ([1, 1], [1, 1], [1, frames, cout, 2 * h, 2 * w], dx.to(DEVICE), cout * ft * fs * fs // cin,
               [1, cout, ft, fs, fs, t, h, w], [1, cout, t * ft, h * fs, w * fs], first_frame)
    return x.to(DEVICE), weight.to(DEVICE), bias.to(DEVICE), scalars


@needs_kernels
@pytest.mark.parametrize("first_frame", [0, 1])
@pytest.mark.parametrize("dx_layout", ["contiguous", "frame_major"])
def test_dup_up_op_takes_the_phases_where_served(kernel_allowed_on_cpu, monkeypatch, first_frame, dx_layout):
    """The fast op runs `phase_conv` and returns the lossless op's layout. Its values are within the module
    docstring's bound of the float64 up-block end: the summed taps' rounding (2**-8 of sum |tap| * |x|) plus
    three roundings of bf16 results (conv output, bias add, shortcut add: 2**-8 of each magnitude, taken 1%
    larger for the rounded intermediates), plus the fp32 sums' 36 * 2**-24 of sum |tap| * |x|."""
    monkeypatch.setattr(wan_upsample_fast, "_CUDNN_PHASES_FASTER", {(16, 16): 1})
    ran = []
    original = wan_upsample_fast.phase_conv
    monkeypatch.setattr(wan_upsample_fast, "phase_conv", lambda *a: ran.append(1) or original(*a))
    x, weight, bias, scalars = _dup_up_case(first_frame, dx_layout)
    fast = torch.ops.rewrite.upsample_conv2d_dup_up_add_fast(x, False, weight, bias, *scalars)
    with use_backend("reference"):
        exact = torch.ops.rewrite.upsample_conv2d_dup_up_add(x, False, weight, bias, *scalars)
        dx64 = scalars[3].double()
        exact64 = torch.ops.rewrite.upsample_conv2d_dup_up_add(x.double(), False, weight.double(), bias.double(),
                                                                *scalars[:3], dx64, *scalars[4:])
    assert ran and fast.shape == exact.shape and fast.stride() == exact.stride()

    def as_output(frames: torch.Tensor) -> torch.Tensor:  # [frames, O, H, W] -> [1, O, frames, H, W]
        return frames.transpose(0, 1).unsqueeze(0)

    conv = as_output(_upsampled_conv(x, weight))
    taps = as_output(_upsampled_conv(x.abs(), weight.abs()))
    rounded = conv.abs() + (conv + bias.double().view(-1, 1, 1, 1)).abs() + exact64.abs()
    bound = (2.0 ** -8 + 36 * 2.0 ** -24) * taps + 1.01 * 2.0 ** -8 * rounded
    error = (fast.double() - exact64).abs()
    assert bool((error <= bound).all()), f"max error {error.max().item():.3g}"


def test_dup_up_op_runs_the_lossless_op_where_not_served(kernel_allowed_on_cpu):
    """16 -> 16 channels are not in the measured table: the lossless op's answer, `torch.equal`."""
    x, weight, bias, scalars = _dup_up_case(0, "contiguous")
    fast = torch.ops.rewrite.upsample_conv2d_dup_up_add_fast(x, False, weight, bias, *scalars)
    exact = torch.ops.rewrite.upsample_conv2d_dup_up_add(x, False, weight, bias, *scalars)
    assert torch.equal(fast, exact) and fast.stride() == exact.stride()


def test_dup_up_phases_reason_names_what_declines():
    reason = wan_upsample_fast.dup_up_phases_reason
    assert "3x3, 1, 1 served" in reason((2, 1024, 8, 8), (1024, 1024, 3, 3), [1, 1], [0, 0], torch.bfloat16)
    assert "bf16/fp16 only" in reason((2, 1024, 8, 8), (1024, 1024, 3, 3), [1, 1], [1, 1], torch.float32)
    assert "not measured faster" in reason((2, 64, 8, 8), (64, 64, 3, 3), [1, 1], [1, 1], torch.bfloat16)
    assert "expected [N, C, H, W]" in reason((2, 1024, 1, 8, 8), (1024, 1024, 3, 3), [1, 1], [1, 1], torch.bfloat16)
    assert "from 57600 source pixels a frame, not 64" in reason((4, 512, 8, 8), (512, 512, 3, 3), [1, 1], [1, 1],
                                                               torch.float16)
    assert reason((4, 512, 180, 320), (512, 512, 3, 3), [1, 1], [1, 1], torch.float16) is None
