"""rewrite.kernels.conv1d.conv1d: the channels-last causal conv kernel, its weight packing and its dispatch rule.

Runs the kernel under the Triton interpreter on CPU (tests/conftest.py sets TRITON_INTERPRET=1 without
CUDA), on CUDA where there is one.

Tolerance of the conv against an fp64 conv of the same TF32-rounded operands: ``|error| <= n * eps32 *
(|w| * |x|)`` per output sample, with ``n = C * K + 2`` the terms summed in fp32 (products, bias, residual)
and ``|w| * |x|`` the conv of the magnitudes: the classic worst-case bound of an n-term fp32 sum (products of
TF32 values are exact in fp32). A wrong index or tap shows up as an error of the size of the output itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewrite.models.auk import alias_free
from rewrite.kernels.conv1d import conv1d as triton_conv1d
from rewrite.kernels.conv1d.conv1d import aten_is_faster, causal_conv1d, chosen, pack_weight, unsupported_reason

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(not (torch.cuda.is_available() or alias_free.INTERPRETING),
                                  reason="needs CUDA or TRITON_INTERPRET=1")
SMALL = (16, 32, 16, 1, 1)  # BLOCK_O, BLOCK_T, BLOCK_C, warps, stages: several blocks on small shapes
EPS32 = torch.finfo(torch.float32).eps


def tf32(t: torch.Tensor) -> torch.Tensor:
    """Round fp32 to the nearest TF32 value, ties away from zero (what the kernels do)."""
    bits = t.contiguous().view(torch.int32).to(torch.int64)
    rounded = ((bits + 0x1000) & ~0x1FFF).to(torch.int32).view(torch.float32)
    return torch.where(t.isfinite(), rounded, t)


def case(batch, channels, out_channels, ksize, dilation, length, seed=0, residual=True, bias=True):
    g = torch.Generator().manual_seed(seed)
    left = dilation * (ksize - 1)
    x = torch.randn(batch, channels, length, generator=g)
    padded = torch.cat([torch.zeros(batch, channels, left), x], dim=2)
    weight = torch.randn(out_channels, channels, ksize, generator=g) / (channels * ksize) ** 0.5
    b = torch.randn(out_channels, generator=g) if bias else None
    r = torch.randn(batch, out_channels, length, generator=g) if residual else None
    on = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731
    return on(padded), on(weight), on(b), on(r)


def run(padded, weight, bias, dilation, residual, config=SMALL, splits=None):
    """The kernel on a channels-last, TF32-rounded copy of an NCL ``padded`` (as the activation kernel writes
    it for the conv: unrounded, the tensor cores would truncate, the interpreter would not)."""
    return causal_conv1d(tf32(padded).transpose(1, 2).contiguous(), pack_weight(weight), bias, dilation, residual,
                         config, splits)


@needs_kernel
@pytest.mark.parametrize("batch, channels, out_channels, ksize, dilation, length, residual, bias", [
    (1, 24, 24, 3, 1, 100, False, True),
    (2, 20, 17, 7, 3, 37, True, True),   # nothing a multiple of a block
    (1, 48, 32, 11, 5, 1, True, False),  # one output sample
    (3, 16, 64, 3, 1, 70, False, False),
])
@pytest.mark.parametrize("config, splits", ((SMALL, 1), (None, None), (SMALL, 3)),
                         ids=("small-blocks", "default", "split-reduction"))
def test_conv_matches_fp64_within_the_sum_bound(batch, channels, out_channels, ksize, dilation, length, residual,
                                                bias, config, splits):
    """Any summation order of the n terms stays within the bound, split slices and their sum included."""
    padded, weight, b, r = case(batch, channels, out_channels, ksize, dilation, length, residual=residual, bias=bias)
    got = run(padded, weight, b, dilation, r, config, splits)
    x64, w64 = tf32(padded).double(), tf32(weight).double()
    want = F.conv1d(x64, w64, None if b is None else b.double(), dilation=dilation)
    magnitude = F.conv1d(x64.abs(), w64.abs(), None if b is None else b.double().abs(), dilation=dilation)
    if r is not None:
        want, magnitude = want + r.double(), magnitude + r.double().abs()
    bound = (channels * ksize + 2) * EPS32 * magnitude
    assert got.shape == (batch, out_channels, length) and got.is_contiguous()
    assert ((got.double() - want).abs() <= bound).all()


@needs_kernel
@pytest.mark.parametrize("splits", (1, 2, 4))
def test_a_window_and_a_batch_row_compute_each_sample_as_the_whole_does(splits):
    """The reduction order of a sample depends on nothing but (C, K, BLOCK_C, splits): a window of the clip
    (shifted by whole time blocks, so that even a CPU BLAS sees the same tile columns) and each batch row alone
    give torch.equal samples. This is what makes tiled decodes agree with whole ones beyond the halos."""
    padded, weight, bias, residual = case(2, 24, 40, 7, 3, 150, residual=True)
    whole = run(padded, weight, bias, 3, residual, splits=splits)
    shift, width, left = 2 * SMALL[1], 50, 3 * 6
    window = run(padded[..., shift:shift + left + width], weight, bias, 3, residual[..., shift:shift + width],
                 splits=splits)
    assert torch.equal(window, whole[..., shift:shift + width])
    alone = run(padded[1:], weight, bias, 3, residual[1:], splits=splits)
    assert torch.equal(alone, whole[1:])


@needs_kernel
def test_more_splits_than_reduction_steps_leave_no_empty_slice():
    """K = 3 taps of one input channel are 3 loop steps: asking for 8 slices runs 3, each a single tap, and the
    result is the sum of the three per-tap convs in tap order (each exact: one product of TF32 values per
    sample), then bias, then residual."""
    padded, weight, bias, residual = case(1, 1, 16, 3, 1, 20)
    got = run(padded, weight, bias, 1, residual, splits=8)
    x, w = tf32(padded), tf32(weight)
    taps = [F.conv1d(x[..., k:k + 20], w[..., k:k + 1]) for k in range(3)]
    want = ((taps[0] + taps[1]) + taps[2]) + bias[:, None] + residual
    assert torch.equal(got, want)


@needs_kernel
def test_pack_weight_is_the_permuted_copy_rounded_to_tf32_for_fp32_only():
    weight = torch.randn(5, 3, 7, device=DEVICE)
    weight[0, 0, :4] = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -12, float("inf"), float("nan")])  # tie, above, inf, nan
    packed = pack_weight(weight)
    assert packed.shape == weight.shape and packed.permute(0, 2, 1).is_contiguous()
    expected = tf32(weight)
    nan = expected.isnan()
    assert torch.equal(packed.isnan(), nan) and torch.equal(packed[~nan], expected[~nan])
    assert packed[0, 0, 0].item() == 1 + 2 ** -10 and packed[0, 0, 1].item() == 1 + 2 ** -10  # ties away from 0
    half = torch.randn(5, 3, 7, device=DEVICE, dtype=torch.bfloat16)
    assert torch.equal(pack_weight(half), half)


def test_unsupported_cases_are_named():
    weight = torch.zeros(32, 8, 3)
    assert unsupported_reason(weight, torch.float32) is None
    assert "output channels" in unsupported_reason(torch.zeros(1, 24, 7), torch.float32)
    assert "dtypes" in unsupported_reason(weight, torch.float16)
    assert "[O, C, K]" in unsupported_reason(torch.zeros(32, 8), torch.float32)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert "TF32 is off" in unsupported_reason(weight, torch.float32)
        assert unsupported_reason(weight.half(), torch.float16) is None  # half types never use TF32
        assert not chosen(weight, torch.float32, 1)


def test_bad_inputs_raise_naming_the_expected_layout():
    padded, weight, bias, residual = case(1, 16, 16, 3, 1, 10)
    with pytest.raises(ValueError, match="contiguous"):
        causal_conv1d(padded.transpose(1, 2), pack_weight(weight), bias, 1, residual)  # an NCL view
    with pytest.raises(ValueError, match="residual must be"):
        causal_conv1d(padded.transpose(1, 2).contiguous(), weight, bias, 1, residual[..., :5])
    with pytest.raises(ValueError, match="no output"):
        causal_conv1d(padded.transpose(1, 2).contiguous()[:, :2], weight, bias, 1)
    with pytest.raises(ValueError, match="output channels"):
        causal_conv1d(padded.transpose(1, 2).contiguous(), weight[:4], bias, 1)


def test_dispatch_rule_keeps_cudnn_for_its_fast_cases():
    assert aten_is_faster(768, 3, 1) is False and aten_is_faster(768, 7, 5) is False
    assert aten_is_faster(768, 11, 1) is True and aten_is_faster(768, 7, 1) is False
    assert aten_is_faster(384, 7, 1) is True and aten_is_faster(384, 11, 5) is False
    assert aten_is_faster(192, 11, 1) is False and aten_is_faster(96, 7, 1) is True
    assert aten_is_faster(48, 11, 1) is False and aten_is_faster(96, 3, 1) is False
    assert chosen(torch.zeros(48, 48, 11), torch.float32, 1)
    assert not chosen(torch.zeros(1, 24, 7), torch.float32, 1)  # conv_post: one output channel



def test_a_card_without_measured_choices_keeps_cudnns_conv(monkeypatch):
    from rewrite.kernels import cards

    weight = torch.zeros(48, 48, 11)
    assert chosen(weight, torch.float32, 1)
    monkeypatch.setattr(cards, "unmeasured_card_reason", lambda device: "no kernel choices were measured on it")
    assert not chosen(weight, torch.float32, 1)

def test_launch_configs_cover_every_channel_count():
    for out_channels in (16, 24, 40, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1536):
        for ksize in (1, 3, 7, 11):
            block_o, block_t, block_c, warps, stages = triton_conv1d.launch_config(out_channels, ksize)
            assert min(block_o, block_t, block_c) >= 16 and warps in (1, 2, 4, 8) and stages >= 1
            assert triton_conv1d.reduction_splits(out_channels, ksize) >= 1


@pytest.mark.skipif(triton_conv1d.triton is None, reason="needs triton")
def test_the_unspecialized_arguments_are_the_dilation_and_the_limit():
    import inspect

    from rewrite.kernels.alias_free import snake as triton_alias_free

    kernel = triton_conv1d._conv1d_kernel
    names = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)
    assert names[triton_conv1d.DILATION_ARG] == "dilation"
    assert names[triton_conv1d.LIMIT_ARGS : triton_conv1d.LIMIT_ARGS + 2] == ["limit_scale", "limit_extra"]
    kernel = triton_alias_free._alias_free_snake_kernel
    names = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters)
    assert names[14:16] == ["limit_scale", "limit_extra"]


@needs_kernel
@pytest.mark.parametrize("splits", (1, 3))
def test_a_valid_frame_limit_skips_tiles_past_it_and_changes_nothing_before(splits):
    """Inside `valid_length.valid_frames`, tiles starting at or past ``(frames + margin) * scale`` return at once
    (their outputs keep whatever the buffer held); every tile before is computed as without the limit."""
    from rewrite.kernels import valid_length

    padded, weight, bias, residual = case(1, 24, 32, 7, 3, 160, residual=True)  # 160 positions: 8 per frame
    whole = run(padded, weight, bias, 3, residual, splits=splits)
    frames = torch.tensor([5], dtype=torch.int32, device=DEVICE)
    with valid_length.valid_frames(frames, 20, 2):  # computes positions below (5 + 2) * 8 = 56: tiles of 32 -> 64
        assert valid_length.kernel_args(160, padded.device)[1:] == (8, 16)
        limited = run(padded, weight, bias, 3, residual, splits=splits)
    assert torch.equal(limited[..., :64], whole[..., :64])
    frames.fill_(20)  # the whole window valid: nothing skipped (the graph reads the value when it runs)
    with valid_length.valid_frames(frames, 20, 2):
        assert torch.equal(run(padded, weight, bias, 3, residual, splits=splits), whole)
    with valid_length.valid_frames(frames, 7, 2):  # 160 positions are no multiple of 7 frames: no limit
        assert valid_length.kernel_args(160, padded.device)[1] == 0


def test_valid_frames_rejects_what_it_cannot_use():
    from rewrite.kernels import valid_length

    with pytest.raises(ValueError, match="int32"):
        with valid_length.valid_frames(torch.zeros(1), 20, 2):
            pass
    with pytest.raises(ValueError, match="bucket"):
        with valid_length.valid_frames(torch.zeros(1, dtype=torch.int32), 0, 2):
            pass
    assert valid_length.kernel_args(160, torch.device("cpu"))[1:] == (0, 0)  # outside: no limit
