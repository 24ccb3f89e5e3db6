"""The channels-last causal conv3d of the Wan ops and the fused ops around it, against the ops they replace.

CPU, Triton interpreter: the fused ops' wiring (the norm written into the padded conv input, deferred conv
biases, the upsample conv and its DupUp3D shortcut).
GPU (`gpu` marker): the whole ops against the reference ops with `torch.equal`, over the shape classes of the
Wan decoders; the causal conv3d op against its reference. The one-kernel RMS norm itself (ATen's summation
order) is tested in tests/kernels/norm/test_rms_norm.py; the pad, epilogue and upsample kernels in
tests/kernels/pad/, epilogue/ and upsample/.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from rewrite.kernels.norm import aten_reduction
from rewrite.kernels import layout
from rewrite.kernels.epilogue import epilogue as triton_epilogue
from rewrite.kernels.norm import rms_norm as triton_norm
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.models.wan import reference as wan_reference
from rewrite.models.wan import ops as _wan_ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.ops.dispatch import use_backend
from rewrite.kernels.launch import FlatBlock
from tests import quick
from tests.kernels.norm.test_rms_norm import CUDA, DEVICE, DTYPES, _frame_major, needs_interpreter, needs_kernels


def test_causal_conv3d_on_cpu_runs_the_replaced_ops():
    g = torch.Generator().manual_seed(4)
    x, cache = torch.randn(1, 4, 1, 5, 6, generator=g), torch.randn(1, 4, 2, 5, 6, generator=g)
    weight, bias = torch.randn(3, 4, 3, 3, 3, generator=g), torch.randn(3, generator=g)
    residual = torch.randn(1, 3, 1, 5, 6, generator=g)
    out, next_cache = torch.ops.rewrite.causal_conv3d(x, cache, [1, 1, 1, 1, 0, 0], "steady_t1", weight, bias, residual)
    padded = torch.nn.functional.pad(torch.cat([cache, x], 2), [1, 1, 1, 1, 0, 0])
    assert torch.equal(out, torch.nn.functional.conv3d(padded, weight, bias) + residual)
    assert torch.equal(next_cache, torch.cat([cache[:, :, -1:], x], 2))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["steady_t1", "steady", "chunk0", "time_conv"])
def test_causal_conv3d_is_bit_identical_on_this_gpu(dtype, case):
    from rewrite.ops import selftest

    g = torch.Generator(device="cuda").manual_seed(5)
    frames = {"steady_t1": 1, "steady": 4, "chunk0": 1, "time_conv": 1}[case]
    channels, height, width = 96, 60, 104
    x = torch.randn(1, channels, frames, height, width, device="cuda", generator=g).to(dtype)
    cache = torch.randn(1, channels, 2, height, width, device="cuda", generator=g).to(dtype)
    kernel = (3, 1, 1) if case == "time_conv" else (3, 3, 3)
    pad = [0, 0, 0, 0, 2, 0] if case == "time_conv" else [1, 1, 1, 1, 0 if case != "chunk0" else 2, 0]
    weight = (0.05 * torch.randn(channels, channels, *kernel, device="cuda", generator=g)).to(dtype)
    bias = torch.randn(channels, device="cuda", generator=g).to(dtype)
    mode = "steady_t1" if case == "time_conv" else case
    cache_arg = None if case == "chunk0" else cache
    out_frames = frames + (2 if case != "chunk0" else 0) + pad[4] - kernel[0] + 1
    for residual in (None, torch.randn(1, channels, out_frames, height, width, device="cuda", generator=g).to(dtype)):
        with use_backend("reference"):
            expected = torch.ops.rewrite.causal_conv3d(x, cache_arg, pad, mode, weight, bias, residual)
        actual = torch.ops.rewrite.causal_conv3d(x, cache_arg, pad, mode, weight, bias, residual)
        assert actual[0].stride() == expected[0].stride()
        assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])
    print({k: v for k, v in selftest.results().items() if "conv3d" in k})


def test_upsample_conv2d_on_cpu_runs_the_replaced_ops():
    g = torch.Generator().manual_seed(7)
    x, weight, bias = torch.randn(2, 4, 3, 5, generator=g), torch.randn(3, 4, 3, 3, generator=g), torch.randn(3, generator=g)
    expected = torch.nn.functional.conv2d(torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest-exact"),
                                          weight, bias, 1, 1)
    assert torch.equal(torch.ops.rewrite.upsample_conv2d(x, True, weight, bias, [1, 1], [1, 1]), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4, 192, 120, 208), (1, 384, 60, 104), (2, 96, 17, 33)], ids=str)
def test_upsample_conv2d_is_bit_identical_on_this_gpu(dtype, shape):
    g = torch.Generator(device="cuda").manual_seed(8)
    n, c, h, w = shape
    x = torch.randn(c, n, h, w, device="cuda", generator=g).to(dtype).transpose(0, 1)  # frames of an NCDHW tensor
    weight = (0.05 * torch.randn(c // 2, c, 3, 3, device="cuda", generator=g)).to(dtype)
    bias = torch.randn(c // 2, device="cuda", generator=g).to(dtype)
    with use_backend("reference"):
        expected = torch.ops.rewrite.upsample_conv2d(x, True, weight, bias, [1, 1], [1, 1])
    actual = torch.ops.rewrite.upsample_conv2d(x, True, weight, bias, [1, 1], [1, 1])
    assert actual.stride() == expected.stride()
    assert torch.equal(actual, expected)


@needs_kernels
@pytest.mark.parametrize("shape,pad,cache_frames,mode,layout,rest_block,cache_layout", quick.product(
    {f"shape{i}": case for i, case in enumerate([((1, 24, 1, 5, 7), [1, 1, 1, 1, 0, 0], 2, "steady_t1"),
                                                 ((1, 24, 3, 5, 70), [1, 1, 1, 1, 0, 0], 2, "steady"),
                                                 ((2, 24, 1, 4, 6), [1, 1, 1, 1, 2, 0], 0, "chunk0"),
                                                 ((1, 200, 1, 3, 5), [0, 0, 0, 0, 0, 0], 2, "steady_t1"),
                                                 ((1, 128, 3, 3, 5), [1, 1, 1, 1, 0, 0], 2, "steady"),
                                                 # a band graph's halo row band: no row pad
                                                 ((1, 24, 1, 6, 7), [1, 1, 0, 0, 0, 0], 2, "steady_t1"),
                                                 ((2, 24, 1, 5, 6), [1, 1, 0, 0, 2, 0], 0, "chunk0")])},
    {name: (name,) for name in ("contiguous", "frame_major", "channels_last_deferred_bias")},
    {"default_block": (None,), "rows_in_32_value_blocks": (FlatBlock(values=32, warps=1),)},
    {name: (name,) for name in ("contiguous", "channels_last")}))
def test_norm_written_into_the_padded_conv_input_is_exact(monkeypatch, shape, pad, cache_frames, mode, layout,
                                                          rest_block, cache_layout):
    """The norm kernel storing into the padded channels-last buffer (and the next cache) plus the kernel for the
    rest (cache frames, zero pad; rows split over several blocks, some entirely inside x) give what the norm
    followed by the channels-last pad kernel gives, and that cache is the reference next cache. Layout
    `channels_last_deferred_bias`: x is a channels-last conv output whose bias the norm kernel adds as it
    reads (the reference: the contiguous tensor plus the bias, `wan_reference.with_deferred_bias`)."""
    if rest_block is not None:
        monkeypatch.setattr(triton_pad, "PAD_REST_BLOCK", rest_block)
    empty = triton_pad._padded_channels_last  # NaN-filled buffers: a position no kernel writes shows up
    monkeypatch.setattr(triton_pad, "_padded_channels_last",
                        lambda *args, **kwargs: tuple(t.fill_(float("nan")) for t in empty(*args, **kwargs)))
    g = torch.Generator().manual_seed(9)
    x = (3 * torch.randn(shape, generator=g)).to(DEVICE, torch.bfloat16)
    x = _frame_major(x) if layout == "frame_major" else x
    gamma = (1 + 0.2 * torch.randn(shape[1], 1, 1, 1, generator=g)).to(DEVICE, torch.bfloat16)
    cache = torch.randn(shape[0], shape[1], cache_frames, *shape[3:], generator=g).to(DEVICE, torch.bfloat16) if cache_frames else None
    if cache is not None and cache_layout == "channels_last":
        cache = cache.contiguous(memory_format=torch.channels_last_3d)
    x_bias = (3 * torch.randn(shape[1], generator=g)).to(DEVICE, torch.bfloat16) if layout.endswith("bias") else None
    x_in = x.contiguous(memory_format=torch.channels_last_3d) if x_bias is not None else x
    x = wan_reference.with_deferred_bias(x, x_bias)  # what the norm normalizes
    split = 2 if not CUDA else aten_reduction.plan(x, torch.float32).split
    with use_backend("triton"):
        normalized = triton_norm.rms_norm_fused(x, gamma, 4.0, 0.0, 1e-12, True, False, split)
        expected = triton_pad.causal_pad_channels_last(normalized, cache, pad)
        actual = triton_norm.rms_norm_padded_channels_last(x_in, gamma, 4.0, 0.0, 1e-12, True, False, split, cache, pad,
                                                          x_bias=x_bias)
    assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])
    assert torch.equal(actual[1], wan_reference.next_cache_reference(normalized, cache, mode))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["steady_t1", "steady", "chunk0"])
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
@pytest.mark.parametrize("channels,height,width", [(96, 60, 104), (1024, 30, 52)], ids=("96", "1024_split_across_blocks"))
def test_rms_norm_causal_conv3d_is_bit_identical_on_this_gpu(dtype, case, layout, channels, height, width):
    g = torch.Generator(device="cuda").manual_seed(10)
    frames = 4 if case == "steady" else 1
    x = (3 * torch.randn(1, channels, frames, height, width, device="cuda", generator=g)).to(dtype)
    x = _frame_major(x) if layout == "frame_major" else x
    gamma = (1 + 0.2 * torch.randn(channels, 1, 1, 1, device="cuda", generator=g)).to(dtype)
    cache = None if case == "chunk0" else torch.randn(1, channels, 2, height, width, device="cuda", generator=g).to(dtype)
    pad = [1, 1, 1, 1, 2 if case == "chunk0" else 0, 0]
    weight = (0.05 * torch.randn(channels, channels, 3, 3, 3, device="cuda", generator=g)).to(dtype)
    bias = torch.randn(channels, device="cuda", generator=g).to(dtype)
    upcast = dtype != torch.float32
    for residual in (None, torch.randn(1, channels, frames, height, width, device="cuda", generator=g).to(dtype)):
        args = (x, gamma, channels ** 0.5, 0.0, 1e-12, upcast, "silu", cache, pad, case, weight, bias, residual)
        with use_backend("reference"):
            expected = torch.ops.rewrite.rms_norm_causal_conv3d(*args)
        actual = torch.ops.rewrite.rms_norm_causal_conv3d(*args)
        assert actual[0].stride() == expected[0].stride()
        assert torch.equal(actual[0], expected[0]) and torch.equal(actual[1], expected[1])


def _deferred_bias_block(dtype, case, channels, height, width, device, generator):
    """A residual block's two norm + conv ops and a 1x1x1 shortcut, as the replaced graph has them (biases in
    their convs) and as `residual_bias` + `norm_input_bias` rewrite them: (expected, actual) outputs."""
    ops = torch.ops.rewrite
    frames = 4 if case == "steady" else 1

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, device=device, generator=generator)).to(dtype)

    x = _frame_major(rand(1, channels, frames, height, width, scale=3.0))
    shortcut_in = _frame_major(rand(1, channels // 2, frames, height, width))
    gamma1, gamma2 = 1 + rand(channels, 1, 1, 1, scale=0.2), 1 + rand(channels, 1, 1, 1, scale=0.2)
    cache1, cache2 = (None, None) if case == "chunk0" else (rand(1, channels, 2, height, width),
                                                            rand(1, channels, 2, height, width))
    pad = [1, 1, 1, 1, 2 if case == "chunk0" else 0, 0]
    w1, w2 = rand(channels, channels, 3, 3, 3, scale=0.05), rand(channels, channels, 3, 3, 3, scale=0.05)
    ws = rand(channels, channels // 2, 1, 1, 1, scale=0.1)
    b1, b2, bs = rand(channels), rand(channels), rand(channels)
    norm = (channels ** 0.5, 0.0, 1e-12, dtype != torch.float32, "silu")
    with use_backend("reference"):
        first = ops.rms_norm_causal_conv3d(x, gamma1, *norm, cache1, pad, case, w1, b1, None)
        shortcut = wan_reference.pointwise_conv3d_reference(shortcut_in, ws, bs)
        second = ops.rms_norm_causal_conv3d(first[0], gamma2, *norm, cache2, pad, case, w2, b2, shortcut)
    with use_backend("auto" if device == "cuda" else "triton"):
        first_d = ops.rms_norm_causal_conv3d(x, gamma1, *norm, cache1, pad, case, w1, None, None, None, None, True)
        shortcut_d = ops.pointwise_conv3d(shortcut_in, ws, None)
        second_d = ops.rms_norm_causal_conv3d(first_d[0], gamma2, *norm, cache2, pad, case, w2, b2, shortcut_d, b1, bs,
                                              False)
    return (first[1], second[0], second[1]), (first_d[1], second_d[0], second_d[1]), first_d[0]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["steady", "chunk0"])
@pytest.mark.parametrize("channels,height,width", [(96, 60, 104), (1024, 30, 52)], ids=("96", "1024_split_across_blocks"))
def test_deferred_conv_biases_are_bit_identical_on_this_gpu(dtype, case, channels, height, width):
    """The first conv's bias added by the second norm (the first op returning cuDNN's channels-last output as it
    is) and the shortcut's bias added in the epilogue: `torch.equal` to the block with its biases in place."""
    g = torch.Generator(device="cuda").manual_seed(13)
    with torch.no_grad():
        expected, actual, raw = _deferred_bias_block(dtype, case, channels, height, width, "cuda", g)
    assert raw.is_contiguous(memory_format=torch.channels_last_3d)
    for e, a in zip(expected, actual):
        assert torch.equal(a, e)


@needs_interpreter
@pytest.mark.parametrize("case", ["steady", "chunk0"])
def test_deferred_conv_biases_wiring_on_cpu(monkeypatch, case):
    """The deferred-bias arguments end to end under the interpreter, the GPU-only gates opened: the kernel paths
    (channels-last raw output, bias added in the norm and in the epilogue) against the ops with the biases in
    place. A CPU conv may fold its bias into the sum and the two layouts' CPU convs sum in other orders, so fp32
    within 1e-4 here (sums of ~200 products of unit-scale values, outputs up to ~10); the GPU test is exact."""
    from rewrite.ops import selftest

    monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *args, **kwargs: True)
    monkeypatch.setattr(selftest, "silu_is_exact", lambda *args, **kwargs: True)
    monkeypatch.setattr(layout, "norm_plan", lambda x, upcast, reference_contiguous=False, rows=None:
                        aten_reduction.NormPlan(split=2, vec=1, ctas=1))
    g = torch.Generator().manual_seed(14)
    expected, actual, raw = _deferred_bias_block(torch.float32, case, 8, 5, 6, "cpu", g)
    assert raw.is_contiguous(memory_format=torch.channels_last_3d)
    for e, a in zip(expected, actual):
        assert a.shape == e.shape and torch.allclose(a, e, rtol=1e-4, atol=1e-4)


def test_rms_norm_causal_conv3d_on_cpu_runs_the_replaced_ops():
    g = torch.Generator().manual_seed(11)
    x, cache = torch.randn(1, 4, 1, 5, 6, generator=g), torch.randn(1, 4, 2, 5, 6, generator=g)
    gamma = torch.randn(4, 1, 1, 1, generator=g)
    weight, bias = torch.randn(3, 4, 3, 3, 3, generator=g), torch.randn(3, generator=g)
    out, next_cache = torch.ops.rewrite.rms_norm_causal_conv3d(x, gamma, 2.0, 0.0, 1e-12, False, "silu", cache,
                                                               [1, 1, 1, 1, 0, 0], "steady_t1", weight, bias, None)
    normalized = wan_reference.rms_norm_reference(x, gamma, 2.0, 0.0, 1e-12, False, "silu")
    padded = torch.nn.functional.pad(torch.cat([cache, normalized], 2), [1, 1, 1, 1, 0, 0])
    assert torch.equal(out, torch.nn.functional.conv3d(padded, weight, bias))
    assert torch.equal(next_cache, torch.cat([cache[:, :, -1:], normalized], 2))


@needs_interpreter
@pytest.mark.parametrize("fused_norm", (False, True))
@pytest.mark.parametrize("case", ["steady_t1", "steady", "chunk0"])
def test_channels_last_path_wiring_on_cpu(monkeypatch, fused_norm, case):
    """The ops' channels-last path end to end under the interpreter, its GPU-only gates opened (the conv
    self-check, ATen's norm order, the SiLU self-test): shapes, layouts and the next cache as the reference's
    (channels-last on both paths: what the pad kernels write and the fake promises).
    CPU convolutions of the two layouts and CPU norms may sum in other orders than the kernels: fp32 outputs
    within 1e-5 (a few ulp of sums of ~100 products of unit-scale values); the next cache of `causal_conv3d`
    is data movement (equal), that of the fused op holds normalized values (the same 1e-5)."""
    from rewrite.ops import selftest

    served = []  # the channels-last pad (or norm-into-pad) kernel's launchers, called on the kernel path only
    for module, name in ((triton_pad, "causal_pad_channels_last"), (triton_norm, "rms_norm_padded_channels_last")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, **k: served.append(1) or _f(*a, **k))

    monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *args, **kwargs: True)
    monkeypatch.setattr(selftest, "silu_is_exact", lambda *args, **kwargs: True)
    monkeypatch.setattr(layout, "norm_plan", lambda x, upcast, reference_contiguous=False, rows=None:
                        aten_reduction.NormPlan(split=2, vec=1, ctas=3))
    g = torch.Generator().manual_seed(12)
    frames = 3 if case == "steady" else 1
    x = torch.randn(1, 8, frames, 5, 6, generator=g)
    cache = None if case == "chunk0" else torch.randn(1, 8, 2, 5, 6, generator=g)
    pad = [1, 1, 1, 1, 2 if case == "chunk0" else 0, 0]
    weight, bias = 0.2 * torch.randn(4, 8, 3, 3, 3, generator=g), torch.randn(4, generator=g)
    residual = torch.randn(1, 4, frames, 5, 6, generator=g)
    gamma = 1 + 0.2 * torch.randn(8, 1, 1, 1, generator=g)
    if fused_norm:
        args = (x, gamma, 8 ** 0.5, 0.0, 1e-12, False, "silu", cache, pad, case, weight, bias, residual)
        op = torch.ops.rewrite.rms_norm_causal_conv3d
    else:
        args = (x, cache, pad, case, weight, bias, residual)
        op = torch.ops.rewrite.causal_conv3d
    with use_backend("reference"):
        expected = op(*args)
    assert not served
    with use_backend("triton"):
        actual = op(*args)
    assert actual[0].stride() == expected[0].stride() and actual[1].shape == expected[1].shape
    assert actual[1].is_contiguous(memory_format=torch.channels_last_3d)
    assert served == [1]  # the kernel path served the call (the reference path's cache is channels-last too now)
    assert expected[1].is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.allclose(actual[0], expected[0], rtol=1e-5, atol=1e-5)
    if fused_norm:
        assert torch.allclose(actual[1], expected[1], rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(actual[1], expected[1])


# ---- the upsample conv's epilogue adding Wan 2.2's DupUp3D shortcut ---------------------------------------
DUP_UP_CASES = {  # (in channels, out channels, factor_t, factor_s, first_frame): Wan 2.2's three kinds, chunk 0 too
    "t2s2": (8, 4, 2, 2, 0), "t2s2_first": (8, 4, 2, 2, 1), "t1s2": (8, 4, 1, 2, 0), "t2s2_more_out": (4, 8, 2, 2, 0)}


def _dup_up_shapes(b, cin, cout, ft, fs, t, h, w):
    return [b, cout, ft, fs, fs, t, h, w], [b, cout, t * ft, h * fs, w * fs], cout * ft * fs * fs // cin


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DUP_UP_CASES)
@pytest.mark.parametrize("dx_layout", ("contiguous", "frame_major"))
def test_conv_epilogue_adds_the_dup_up_shortcut_with_atens_roundings(dtype, case, dx_layout):
    """Bias add and the gathered shortcut add in the epilogue: data movement and two ATen add roundings."""
    cin, cout, ft, fs, first = DUP_UP_CASES[case]
    g = torch.Generator().manual_seed(13)
    b, t, h, w = 2, 2, 3, 5
    unfold, fold, repeats = _dup_up_shapes(b, cin, cout, ft, fs, t, h, w)
    frames = t * ft - first
    dx = torch.randn(b, cin, t, h, w, generator=g).to(DEVICE, dtype)
    dx = _frame_major(dx) if dx_layout == "frame_major" else dx
    y = torch.randn(b * frames, cout, h * fs, w * fs, generator=g).to(DEVICE, dtype)
    y = y.contiguous(memory_format=torch.channels_last)
    bias = torch.randn(cout, generator=g).to(DEVICE, dtype)
    y5 = y.view(b, frames, *y.shape[1:]).permute(0, 2, 1, 3, 4)
    main = (y.contiguous() + bias.view(1, -1, 1, 1)).view(b, frames, *y.shape[1:]).permute(0, 2, 1, 3, 4)
    with use_backend("reference"):
        expected = torch.ops.rewrite.dup_up_add(main, dx, repeats, unfold, fold, first)
    actual = triton_epilogue.conv_epilogue(y5, bias, None, expected.stride(), dup_up=(dx, repeats, ft, fs, first))
    assert actual.stride() == expected.stride()
    assert torch.equal(actual, expected)


def _upsample_dup_up_args(g, dtype, device, case, scale=1):
    cin, cout, ft, fs, first = DUP_UP_CASES[case]
    cin, cout = cin * scale, cout * scale
    b, t, h, w = 1, 2, 3 * scale, 5 * scale
    unfold, fold, repeats = _dup_up_shapes(b, cin, cout, ft, fs, t, h * 2 // fs, w * 2 // fs)
    frames = t * ft - first
    x = torch.randn(cin, b * frames, h, w, generator=g).to(device, dtype).transpose(0, 1)  # frames of an NCDHW tensor
    weight = (0.2 * torch.randn(cout, cin, 3, 3, generator=g)).to(device, dtype)
    bias = torch.randn(cout, generator=g).to(device, dtype)
    dx = torch.randn(b, cin, t, h * 2 // fs, w * 2 // fs, generator=g).to(device, dtype)
    return (x, dtype != torch.float32, weight, bias, [1, 1], [1, 1], [b, frames, cout, 2 * h, 2 * w], dx, repeats,
            unfold, fold, first)


@contextlib.contextmanager
def _epilogue_calls(monkeypatch):
    """Records each `conv_epilogue` call ("dup_up" or "plain") while it runs."""
    calls, original = [], triton_epilogue.conv_epilogue

    def spy(*args, **kwargs):
        calls.append("dup_up" if kwargs.get("dup_up") is not None else "plain")
        return original(*args, **kwargs)

    monkeypatch.setattr(triton_epilogue, "conv_epilogue", spy)
    yield calls
    monkeypatch.setattr(triton_epilogue, "conv_epilogue", original)


@pytest.mark.parametrize("case", DUP_UP_CASES)
def test_upsample_conv2d_dup_up_add_on_cpu_runs_the_replaced_ops(case):
    args = _upsample_dup_up_args(torch.Generator().manual_seed(14), torch.float32, "cpu", case)
    x, upcast, weight, bias, stride, padding, frames_shape, dx, repeats, unfold, fold, first = args
    y = torch.ops.rewrite.upsample_conv2d(x, upcast, weight, bias, stride, padding)
    main = y.view(frames_shape).permute(0, 2, 1, 3, 4)
    expected = torch.ops.rewrite.dup_up_add(main, dx, repeats, unfold, fold, first)
    actual = torch.ops.rewrite.upsample_conv2d_dup_up_add(*args)
    assert actual.stride() == expected.stride() and torch.equal(actual, expected)


@needs_interpreter
@pytest.mark.parametrize("case", DUP_UP_CASES)
def test_upsample_conv2d_dup_up_add_wiring_on_cpu(monkeypatch, case):
    """The op's kernel path under the interpreter, the conv self-check opened: layout as the reference's; the
    CPU conv of the two layouts may sum in other orders: fp32 within 1e-5 (a few ulp of sums of ~70 products)."""
    from rewrite.ops import selftest

    monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *args, **kwargs: True)
    args = _upsample_dup_up_args(torch.Generator().manual_seed(15), torch.float32, "cpu", case)
    with use_backend("reference"):
        expected = torch.ops.rewrite.upsample_conv2d_dup_up_add(*args)
    with use_backend("triton"), _epilogue_calls(monkeypatch) as calls:
        actual = torch.ops.rewrite.upsample_conv2d_dup_up_add(*args)
    assert calls == ["dup_up"]  # the kernel path served the call
    assert actual.stride() == expected.stride()
    assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", DUP_UP_CASES)
def test_upsample_conv2d_dup_up_add_is_bit_identical_on_this_gpu(monkeypatch, dtype, case):
    from rewrite.ops import selftest

    args = _upsample_dup_up_args(torch.Generator().manual_seed(16), dtype, "cuda", case, scale=16)
    with use_backend("reference"):
        expected = torch.ops.rewrite.upsample_conv2d_dup_up_add(*args)
    with _epilogue_calls(monkeypatch) as calls:
        actual = torch.ops.rewrite.upsample_conv2d_dup_up_add(*args)
    x, weight = args[0], args[2]
    n, c, h, w = x.shape
    served = selftest.channels_last_conv_is_exact((n, c, 2 * h, 2 * w), tuple(weight.shape), dtype, x.device, (1, 1))
    assert calls == (["dup_up"] if served else [])  # the kernel path serves where cuDNN's layouts agree
    assert actual.stride() == expected.stride()
    assert torch.equal(actual, expected)
