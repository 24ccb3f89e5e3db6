"""The one-pass Wan RMS norm of level ``channels_last`` (`rewrite.kernels.norm.one_pass`) and its routing.

Tolerance: the kernel computes in fp32 from the rounded input and rounds once, so each normalized value is
within half an output ulp of its fp32 value, which is within a few 2^-23 relative of the exact value (the
sum of C squares, a square root, a division, two products and SiLU's sigmoid: each fp32 op errs by at most
2^-24 relative plus the sum's C * 2^-24; SiLU amplifies a relative error by at most 1 + |y| <= 13 here). The
check allows one ulp of the output dtype at the exact value plus 1e-4 relative, far above that fp32 error
and far below a second ulp. Positions the kernel does not compute (cache frames, zero pad) must be the pad
kernel's, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.norm import one_pass as triton_norm_fast
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.models.wan import reference as wan_reference
from rewrite.ops.dispatch import INTERPRETING
from tests.op_cases import frame_major
from tests.ulps import ulp

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")


def _reference(x, x_bias, gamma, scale, bias, eps, silu, cache, pad, mode):
    """(padded input, next cache) in float64 from x completed with its deferred bias (ATen's rounding)."""
    v = wan_reference.with_deferred_bias(x, x_bias).double()
    norm = torch.linalg.vector_norm(v, dim=1, keepdim=True).clamp_min(eps)
    y = v / norm * scale * gamma.double().view(1, -1, 1, 1, 1) + bias
    if silu:
        y = torch.nn.functional.silu(y)
    return wan_reference.causal_conv_input_reference(y, None if cache is None else cache.double(), pad, mode)


CASES = [  # (shape, pad, cache frames, mode)
    ((1, 24, 3, 5, 7), [1, 1, 1, 1, 0, 0], 2, "steady"),
    ((2, 40, 1, 4, 6), [1, 1, 1, 1, 0, 0], 2, "steady_t1"),
    ((1, 96, 1, 3, 5), [1, 1, 1, 1, 2, 0], 0, "chunk0"),
    ((1, 1024, 2, 2, 3), [1, 1, 1, 1, 0, 0], 2, "steady"),  # Wan 2.2's widest levels: the 8-warp program
]


@needs_kernels
@pytest.mark.parametrize("shape,pad,cache_frames,mode", CASES)
@pytest.mark.parametrize("layout", ("contiguous", "frame_major", "channels_last_deferred_bias"))
@pytest.mark.parametrize("dtype,silu", [(torch.bfloat16, True), (torch.float16, False)])
def test_one_pass_norm_into_the_padded_input(shape, pad, cache_frames, mode, layout, dtype, silu, monkeypatch):
    empty = triton_pad._padded_channels_last  # NaN-filled buffers: a position no kernel writes shows up
    monkeypatch.setattr(triton_pad, "_padded_channels_last",
                        lambda *args, **kwargs: tuple(t.fill_(float("nan")) for t in empty(*args, **kwargs)))
    g = torch.Generator().manual_seed(4)
    channels = shape[1]
    x = (3 * torch.randn(shape, generator=g)).to(DEVICE, dtype)
    x = frame_major(x) if layout == "frame_major" else x
    x_bias = (2 * torch.randn(channels, generator=g)).to(DEVICE, dtype) if layout.endswith("bias") else None
    x_in = x.contiguous(memory_format=torch.channels_last_3d) if x_bias is not None else x
    gamma = (1 + 0.2 * torch.randn(channels, 1, 1, 1, generator=g)).to(DEVICE, dtype)
    cache = (torch.randn(shape[0], channels, cache_frames, *shape[3:], generator=g).to(DEVICE, dtype)
             if cache_frames else None)
    scale, bias, eps = channels ** 0.5, 0.1, 1e-12
    padded, next_cache = triton_norm_fast.rms_norm_padded_one_pass(x_in, gamma, scale, bias, eps, silu, cache, pad, x_bias)
    expected_padded, expected_cache = _reference(x, x_bias, gamma, scale, bias, eps, silu, cache, pad, mode)
    assert padded.is_contiguous(memory_format=torch.channels_last_3d)
    for actual, expected in ((padded, expected_padded), (next_cache, expected_cache)):
        assert actual.shape == expected.shape and not actual.isnan().any()
        error = (actual.double() - expected).abs()
        bound = ulp(expected, dtype) + 1e-4 * expected.abs()
        assert bool((error <= bound).all()), f"max error {error.max().item():.3g}"
    # what the pad kernel writes (cache frames, zero pad) is the pad kernel's own
    rest, rest_cache = triton_pad.causal_pad_channels_last(x_in, cache, pad)
    tc = 0 if cache is None else cache.shape[2]
    frames = slice(pad[4] + tc, pad[4] + tc + shape[2])
    outside = torch.ones(padded.shape, dtype=torch.bool, device=DEVICE)
    outside[:, :, frames, pad[2]:pad[2] + shape[3], pad[0]:pad[0] + shape[4]] = False
    assert torch.equal(padded[outside], rest[outside])


def test_one_pass_reason_names_what_it_does_not_serve():
    assert "channels" in triton_norm_fast.one_pass_reason(torch.empty(1, 2048, 1, 2, 2))
    assert "strided run" in triton_norm_fast.one_pass_reason(torch.empty(1, 8, 1, 4, 6).transpose(3, 4))
    assert triton_norm_fast.one_pass_reason(torch.empty(1, 96, 1, 2, 2)) is None
    with pytest.raises(ValueError, match="gamma"):
        triton_norm_fast.rms_norm_padded_one_pass(torch.empty(1, 8, 1, 2, 2), torch.ones(4), 1.0, 0.0, 1e-12, True,
                                                  None, [1, 1, 1, 1, 2, 0])


def test_one_pass_norm_is_chosen_by_channel_count(monkeypatch):
    assert wan_fast.one_pass_norm_chosen(torch.empty(1, 96, 1, 2, 2))
    assert not wan_fast.one_pass_norm_chosen(torch.empty(1, 1024, 1, 2, 2))  # served, but not chosen (tuning 1.14)
    assert not wan_fast.one_pass_norm_chosen(torch.empty(1, 2048, 1, 2, 2))  # not chosen, and too wide
    monkeypatch.setattr(wan_fast, "_ONE_PASS_NORM_CHANNELS", frozenset({2048}))
    assert not wan_fast.one_pass_norm_chosen(torch.empty(1, 2048, 1, 2, 2))  # chosen, but the kernel cannot


@needs_kernels
def test_the_fast_op_normalizes_with_the_one_pass_kernel_where_chosen(kernel_allowed_on_cpu, monkeypatch):
    """The fast op's kernel path takes the one-pass norm for a chosen channel count: its next cache is that
    kernel's, bit for bit, and its output the conv of that kernel's padded input."""
    from tests.op_cases import kernel_gates_open

    kernel_gates_open(monkeypatch)
    monkeypatch.setattr(wan_fast, "_ONE_PASS_NORM_CHANNELS", frozenset({16}))
    calls = []
    original = triton_norm_fast.rms_norm_padded_one_pass
    monkeypatch.setattr(triton_norm_fast, "rms_norm_padded_one_pass", lambda *a: calls.append(1) or original(*a))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 16, 2, 3, 9, generator=g).to(DEVICE, torch.bfloat16)
    cache = torch.randn(1, 16, 2, 3, 9, generator=g).to(DEVICE, torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn(16, 1, 1, 1, generator=g)).to(DEVICE, torch.bfloat16)
    weight = (0.1 * torch.randn(16, 16, 3, 3, 3, generator=g)).to(DEVICE, torch.bfloat16)
    pad = [1, 1, 1, 1, 0, 0]
    out, next_cache = torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, gamma, 4.0, 0.0, 1e-12, True, "silu", cache, pad,
                                                                    "steady", weight, None, None)
    assert calls, "the one-pass norm did not run"
    padded, expected_cache = original(x, gamma, 4.0, 0.0, 1e-12, True, cache, pad, None)
    assert torch.equal(next_cache, expected_cache)
    expected = torch.empty_like(out)
    triton_conv3d.conv3d_channels_last(padded, weight.contiguous(memory_format=torch.channels_last_3d), None, None,
                                       expected)
    assert torch.equal(out, expected)


def test_fast_reason_admits_a_kept_cudnn_conv_behind_a_chosen_norm():
    """256 channels: cuDNN's conv stays (not chosen), the one-pass norm serves; 1024, fp32 and Wan 2.1's 384
    (a count whose one-pass norm is chosen before our conv only): neither."""
    shape, weight = (1, 256, 4, 22, 34), (256, 256, 3, 3, 3)
    assert "cuDNN's conv measured faster" in wan_fast.conv_reason(shape, weight, torch.bfloat16)
    assert wan_fast.fast_reason(shape, weight, torch.bfloat16) is None
    assert "one-pass norm is not chosen for 1024" in wan_fast.fast_reason((1, 1024, 4, 22, 34), (1024, 1024, 3, 3, 3),
                                                                          torch.bfloat16)
    assert wan_fast.fast_reason(shape, weight, torch.float32) is not None
    assert "one-pass norm is not chosen for 384" in wan_fast.fast_reason((1, 384, 3, 92, 162), (384, 384, 3, 3, 3),
                                                                         torch.bfloat16)


@needs_kernels
@pytest.mark.parametrize("residual", [False, True])
def test_the_fast_op_runs_cudnns_conv_after_the_one_pass_norm_where_the_conv_is_kept(kernel_allowed_on_cpu,
                                                                                    monkeypatch, residual):
    """A conv `triton_conv3d.chosen` leaves to cuDNN, with a chosen channel count: the op's next cache is the
    one-pass kernel's, and its output the ``lossless`` op's conv and epilogue of that kernel's padded input,
    bit for bit."""
    from rewrite.models.wan import ops as wan_ops
    from tests.op_cases import kernel_gates_open

    kernel_gates_open(monkeypatch)
    monkeypatch.setattr(triton_conv3d, "_FASTER_THAN_CUDNN", {})
    monkeypatch.setattr(wan_fast, "_ONE_PASS_NORM_CHANNELS", frozenset({16}))
    monkeypatch.setattr(wan_fast, "_ONE_PASS_BEFORE_CUDNN_CHANNELS", frozenset({16}))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 16, 2, 3, 9, generator=g).to(DEVICE, torch.bfloat16)
    cache = torch.randn(1, 16, 2, 3, 9, generator=g).to(DEVICE, torch.bfloat16)
    gamma = (1 + 0.1 * torch.randn(16, 1, 1, 1, generator=g)).to(DEVICE, torch.bfloat16)
    weight = (0.1 * torch.randn(16, 16, 3, 3, 3, generator=g)).to(DEVICE, torch.bfloat16)
    bias = torch.randn(16, generator=g).to(DEVICE, torch.bfloat16)
    res = torch.randn(1, 16, 2, 3, 9, generator=g).to(DEVICE, torch.bfloat16) if residual else None
    pad = [1, 1, 1, 1, 0, 0]
    out, next_cache = torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, gamma, 4.0, 0.0, 1e-12, True, "silu", cache, pad,
                                                                    "steady", weight, bias, res)
    padded, expected_cache = triton_norm_fast.rms_norm_padded_one_pass(x, gamma, 4.0, 0.0, 1e-12, True, cache, pad)
    assert torch.equal(next_cache, expected_cache)
    expected = wan_ops.channels_last_conv(padded, weight, bias, res)
    assert torch.equal(out, expected) and out.stride() == expected.stride()
