"""The one-kernel RMS norm (ATen's summation order) and the channels-last causal conv3d of the Wan ops.

CPU, Triton interpreter: the channel-norm kernel is `torch.equal` to a float64 emulation of the order that
`rewrite.ops.aten_reduction` describes (fma chains per accumulator, then the fixed combination; each step
rounded to fp32: the interpreter's fma rounds once, the emulation rounds the exact float64 product-sum once,
so both are the same fp32 value unless float64 itself rounded, which these inputs do not hit); the fused
norm's epilogue then equals ATen's CPU epilogue ops applied to that norm (bit-exact without SiLU; with SiLU
within 2 ulp, as numpy's exp is not libdevice's); the channels-last pad and the conv epilogue are pure data
movement and ATen's add roundings: `torch.equal`.
GPU (`gpu` marker): the norm against ATen's `linalg_vector_norm` and the whole op against the reference
ops with `torch.equal`, over the shape classes of the Wan decoders; the causal conv3d op against its reference.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from rewrite.ops import (aten_reduction, layout, triton_epilogue, triton_norm, triton_pad, triton_upsample,
                         wan_reference, wan_upsample_fast)
from rewrite.ops import wan as _wan_ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.ops.dispatch import INTERPRETING, use_backend
from rewrite.ops.triton_launch import FlatBlock
from tests import quick

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")
needs_interpreter = pytest.mark.skipif(not INTERPRETING or CUDA, reason="CPU tensors under TRITON_INTERPRET=1")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _frame_major(t: torch.Tensor) -> torch.Tensor:
    return t.permute(0, 2, 1, 3, 4).contiguous().permute(0, 2, 1, 3, 4)


def _rounded(t: torch.Tensor) -> torch.Tensor:
    return t.float().double()


def _halving_tree(values: list) -> torch.Tensor:
    while len(values) > 1:
        half = len(values) // 2
        values = [_rounded(values[i] + values[i + half]) for i in range(half)]
    return values[0]


def emulated_channel_norm(x: torch.Tensor, split: int, ctas: int = 1, pieces: tuple[int, ...] = ()) -> torch.Tensor:
    """ATen's order (see `aten_reduction`) in float64, rounding to fp32 after every step; with `pieces` (32-bit
    pieces over the channels), each piece's sum in that order, the sums added left to right."""
    xf = x.float().movedim(1, -1).double()
    bounds = (0, *pieces, xf.shape[-1])
    total = None
    for lo, hi in zip(bounds, bounds[1:]):
        piece = _emulated_channel_sum(xf[..., lo:hi], split, ctas)
        total = piece if total is None else _rounded(total + piece)
    return total.sqrt().float().unsqueeze(1)


def _emulated_channel_sum(xf: torch.Tensor, split: int, ctas: int) -> torch.Tensor:
    channels = xf.shape[-1]
    partials = []
    for g in range(ctas):
        threads = []
        for y in range(split):
            accumulators = [torch.zeros(xf.shape[:-1], dtype=torch.float64) for _ in range(4)]
            for j, c in enumerate(range(y + g * split, channels, split * ctas)):
                v = xf[..., c]
                accumulators[j % 4] = _rounded(v * v + accumulators[j % 4])
            total = accumulators[0]
            for other in accumulators[1:]:
                total = _rounded(total + other)
            threads.append(total)
        partials.append(_halving_tree(threads))
    if ctas > 1:  # the last block: thread y adds the partials of blocks y, y + split, ... to 0
        last = [torch.zeros_like(partials[0]) for _ in range(split)]
        for g, partial in enumerate(partials):
            last[g % split] = _rounded(last[g % split] + partial)
        partials = [_halving_tree(last)]
    return partials[0]


# ---- the plan: a transcription of setReduceConfig, checked on known configurations ----------------------
@pytest.mark.parametrize("outputs,channels,vec,expected", [
    (6240, 384, 4, (4, 1)),     # Wan 2.1 480p lowest stage: 4 warps split the channels
    (1597440, 96, 4, (4, 1)),   # Wan 2.1 480p last stage, 4 frames
    (3600, 1024, 4, (4, 16)),   # Wan 2.2 720p 1024 channels over few outputs: split across 16 blocks too
    (28800, 1024, 4, (4, 10)),  # two frames at 90 x 160: 10 blocks
    (230400, 1024, 4, (4, 2)),  # four frames at 180 x 320: 2 blocks
    (1683, 384, 1, (16, 1)),    # odd width: no vectorized outputs, 16 warps
    (63, 40, 1, (1, 1)),        # few channels: one thread per output
])
def test_split_follows_set_reduce_config(outputs, channels, vec, expected):
    assert aten_reduction.split_for(outputs, channels, vec, multiprocessors=132, threads_per_mp=2048) == expected


def test_output_vec_size_reads_alignment_and_strides():
    assert aten_reduction.output_vec_size((1, 96, 4, 60, 104), (2396160, 24960, 6240, 104, 1), 0, 4) == 4
    assert aten_reduction.output_vec_size((1, 96, 1, 7, 9), (6048, 63, 63, 9, 1), 0, 4) == 1
    assert aten_reduction.output_vec_size((1, 8, 1, 2, 3), (48, 6, 6, 3, 1), 0, 4) == 2
    assert aten_reduction.output_vec_size((1, 96, 4, 60, 104), (2396160, 24960, 6240, 104, 1), 8, 4) == 2


def test_plan_is_none_off_cuda():
    assert aten_reduction.plan(torch.randn(1, 8, 1, 4, 4), torch.float32) is None


# ---- inputs of 2 GiB and more: ATen's 32-bit pieces ---------------------------------------------------
def _contiguous(shape):
    return aten_reduction._contiguous_strides(shape)


def _frame_major_strides(shape):
    b, c, t, h, w = shape
    return (t * c * h * w, h * w, c * h * w, w, 1)


@pytest.mark.parametrize("shape,strides,expected", [
    # Wan 2.1 1088x1920, last stage (fp32 copy 3.2 GB): two 48-channel pieces, one thread per output each
    ((1, 96, 4, 1088, 1920), _contiguous((1, 96, 4, 1088, 1920)), aten_reduction.NormPlan(1, 4, 1, (48,))),
    ((2, 96, 4, 1088, 1920), _contiguous((2, 96, 4, 1088, 1920)), aten_reduction.NormPlan(1, 4, 1, (48,))),
    ((1, 256, 4, 1088, 1920), _contiguous((1, 256, 4, 1088, 1920)), aten_reduction.NormPlan(4, 4, 1, (64, 128, 192))),
    ((1, 512, 4, 1088, 1920), _contiguous((1, 512, 4, 1088, 1920)), None),  # eight pieces: more than kept
    # batches and frames are split first where they are the slower dims: whole channels, pieces of outputs
    ((3, 96, 4, 720, 1280), _contiguous((3, 96, 4, 720, 1280)), aten_reduction.NormPlan(4, 4, 1)),
    ((1, 96, 4, 1088, 1920), _frame_major_strides((1, 96, 4, 1088, 1920)), aten_reduction.NormPlan(4, 4, 1)),
], ids=str)
def test_inputs_past_32_bit_indexing_take_atens_pieces(monkeypatch, shape, strides, expected):
    monkeypatch.setattr(aten_reduction, "_device_limits", lambda index: (132, 2048))  # an H100 / H200
    assert aten_reduction._max_offset(shape, strides, 4) > aten_reduction.INT32_MAX
    assert aten_reduction.split_plan(shape, strides, 0, 4, 0) == expected


def test_32_bit_pieces_are_halves_of_the_widest_dim_first_half_first():
    dims = aten_reduction._iterator_dims((3, 96, 4, 720, 1280), _contiguous((3, 96, 4, 720, 1280)), 4)
    assert [d.size for d in dims] == [96, 4 * 720 * 1280, 3]  # channels first, (t, h, w) coalesced, batch
    pieces = aten_reduction.split_pieces(dims)
    assert [ranges[2] for ranges in pieces] == [(0, 1), (1, 1), (2, 1)]  # 1 then 2 = 1 + 1 batches
    assert all(ranges[:2] == ((0, 96), (0, 4 * 720 * 1280)) for ranges in pieces)
    wide = aten_reduction._iterator_dims((1, 200, 4, 1088, 1920), _contiguous((1, 200, 4, 1088, 1920)), 4)
    assert [ranges[0] for ranges in aten_reduction.split_pieces(wide)] == [(0, 50), (50, 50), (100, 50), (150, 50)]


# ---- kernels under the interpreter --------------------------------------------------------------------
@needs_interpreter
@pytest.mark.parametrize("shape,split,ctas", [((1, 96, 2, 5, 7), 4, 1), ((2, 40, 1, 3, 5), 1, 1),
                                              ((1, 19, 3, 4, 4), 2, 1), ((1, 64, 1, 6, 6), 16, 1),
                                              ((1, 24, 2, 3, 40), 8, 1), ((1, 200, 1, 3, 5), 4, 10),
                                              ((1, 130, 2, 2, 3), 4, 16), ((1, 77, 1, 3, 4), 2, 3)])
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
def test_channel_norm_kernel_follows_the_order(shape, split, ctas, layout):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    x = _frame_major(x) if layout == "frame_major" else x
    assert torch.equal(triton_norm.channel_norm(x, split, ctas), emulated_channel_norm(x, split, ctas))


@needs_interpreter
@pytest.mark.parametrize("shape,split,ctas,pieces", [((1, 96, 2, 5, 7), 1, 1, (48,)), ((1, 19, 2, 6, 9), 2, 1, (5, 11, 17)),
                                                     ((2, 200, 1, 3, 5), 4, 10, (100,)), ((1, 64, 2, 6, 6), 4, 1, (32,))])
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
def test_channel_norm_kernel_adds_the_32_bit_pieces_in_order(shape, split, ctas, pieces, layout):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    x = _frame_major(x) if layout == "frame_major" else x
    actual = triton_norm.channel_norm(x, split, ctas, pieces)
    assert torch.equal(actual, emulated_channel_norm(x, split, ctas, pieces))
    assert not torch.equal(actual, triton_norm.channel_norm(x, split, ctas))  # the pieces change the sums


@needs_interpreter
def test_fused_norms_add_the_32_bit_pieces():
    """The whole-norm kernel and the one storing into the padded conv input take the pieces as the channel norm
    does: the first equals ATen's epilogue on the emulated norm, the second its pad."""
    g = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(1, 96, 2, 5, 7, generator=g)).to(torch.bfloat16)
    gamma = (1 + 0.2 * torch.randn(96, 1, 1, 1, generator=g)).to(torch.bfloat16)
    y = (x.float() / emulated_channel_norm(x, 1, 1, (48,)).clamp_min(1e-12)).to(torch.bfloat16) * 4.0 * gamma + 0.0
    fused = triton_norm.rms_norm_fused(x, gamma, 4.0, 0.0, 1e-12, True, False, 1, pieces=(48,))
    assert torch.equal(fused, y)
    pad = [1, 1, 1, 1, 2, 0]
    cache = torch.randn(1, 96, 2, 5, 7, generator=g).to(torch.bfloat16)
    padded, next_cache = triton_norm.rms_norm_padded_channels_last(x, gamma, 4.0, 0.0, 1e-12, True, False, 1, cache,
                                                                   pad, pieces=(48,))
    expected = triton_pad.causal_pad_channels_last(fused, cache, pad)
    assert torch.equal(padded, expected[0]) and torch.equal(next_cache, expected[1])


@needs_interpreter
def test_channel_norm_pieces_must_be_increasing_channel_boundaries():
    x = torch.randn(1, 8, 1, 2, 2)
    for pieces in ((4, 2), (0, 4), (8,), (1, 2, 3, 4)):
        with pytest.raises(ValueError, match="norm pieces"):
            triton_norm.channel_norm(x, 1, 1, pieces)


@needs_interpreter
def test_the_global_order_is_not_the_one_block_order():
    """The kernel's block split changes its sums for these inputs (else the cases above could not tell)."""
    x = torch.randn(1, 200, 1, 3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert not torch.equal(triton_norm.channel_norm(x, 4, 10), triton_norm.channel_norm(x, 4, 1))


@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", (None, "silu"))
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
def test_fused_norm_epilogue_matches_aten_ops_on_that_norm(dtype, act, layout):
    g = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(2, 24, 2, 5, 9, generator=g)).to(dtype)
    x = _frame_major(x) if layout == "frame_major" else x
    gamma = (1 + 0.2 * torch.randn(24, 1, 1, 1, generator=g)).to(dtype)
    upcast = dtype != torch.float32
    scale = 24 ** 0.5
    norm = emulated_channel_norm(x, 2)
    y = x.float() / norm.clamp_min(1e-12)
    y = (y.to(dtype) if upcast else y) * scale * gamma + 0.0
    expected = torch.nn.functional.silu(y) if act == "silu" else y
    actual = triton_norm.rms_norm_fused(x, gamma, scale, 0.0, 1e-12, upcast, act == "silu", split=2)
    assert actual.stride() == expected.stride()
    if act is None:
        assert torch.equal(actual, expected)
    else:  # numpy's exp under the interpreter: 2 ulp of the dtype (see tests/models/wan/test_ops.py)
        ulp = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]
        assert torch.allclose(actual.float(), expected.float(), rtol=2 * ulp, atol=2 * ulp)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
@pytest.mark.parametrize("shape,pad,cache_frames", [((1, 5, 1, 4, 7), [1, 1, 1, 1, 0, 0], 2),
                                                    ((2, 70, 2, 3, 66), [1, 1, 1, 1, 2, 0], 0),
                                                    ((1, 3, 3, 2, 5), [0, 0, 0, 0, 2, 0], 0),
                                                    ((1, 96, 1, 2, 3), [0, 0, 0, 0, 0, 0], 2),
                                                    # a band graph's halo row band: columns padded, rows not
                                                    ((1, 5, 1, 6, 7), [1, 1, 0, 0, 0, 0], 2),
                                                    ((2, 7, 1, 5, 6), [1, 1, 0, 0, 2, 0], 0)])
def test_channels_last_causal_pad_is_exact(dtype, layout, shape, pad, cache_frames):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=g).to(DEVICE, dtype)
    x = _frame_major(x) if layout == "frame_major" else x
    cache = torch.randn(shape[0], shape[1], cache_frames, *shape[3:], generator=g).to(DEVICE, dtype) if cache_frames else None
    source = x if cache is None else torch.cat([cache, x], 2)
    expected = torch.nn.functional.pad(source, pad)
    temporal = torch.nn.functional.pad(source, [0, 0, 0, 0, pad[4], 0])
    with use_backend("triton"):
        actual, next_cache = triton_pad.causal_pad_channels_last(x, cache, pad)
    assert actual.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(actual, expected)
    assert torch.equal(next_cache, temporal[:, :, -2:])  # the last two frames before the right pad
    mode = "chunk0" if cache is None else ("steady_t1" if shape[2] == 1 else "steady")
    if (cache is not None or pad[4] >= 1) and (mode != "chunk0" or shape[2] == 1):  # chunk 0 has one frame
        assert torch.equal(next_cache, wan_reference.next_cache_reference(x, cache, mode))


@needs_kernels
@pytest.mark.parametrize("layout", ("contiguous", "frame_major", "frames_of_ncdhw"))
@pytest.mark.parametrize("shape,pad", [((1, 5, 3, 4, 7), [1, 1, 1, 1, 0, 0]), ((2, 70, 1, 3, 66), [1, 2, 0, 1, 1, 1])])
def test_channels_last_pad_is_exact(layout, shape, pad):
    """`pad_channels_last` (no cache, no next cache) and the upsampler's padded source built from it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(shape, generator=g).to(DEVICE, torch.bfloat16)
    x = {"contiguous": x, "frame_major": _frame_major(x),
         "frames_of_ncdhw": x.transpose(0, 2).contiguous().transpose(0, 2)}[layout]
    with use_backend("triton"):
        actual = triton_pad.pad_channels_last(x, pad)
        frames = x[0].transpose(0, 1)  # [T, C, H, W]: the per-frame view an upsampler's conv reads
        source = wan_upsample_fast.padded_source(frames)
    assert actual.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(actual, torch.nn.functional.pad(x, pad))
    assert source.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(source, torch.nn.functional.pad(frames, [1, 1, 1, 1]))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias,residual,residual_bias", [(True, True, False), (True, False, False),
                                                        (False, True, False), (False, False, False),
                                                        (True, True, True), (False, True, True)])
@pytest.mark.parametrize("out_layout", ("contiguous", "frame_major"))
def test_conv_epilogue_adds_with_atens_roundings(dtype, bias, residual, residual_bias, out_layout):
    """Bias, residual and the residual's own deferred bias (a shortcut conv output without it) added with the
    roundings of ATen's `y.add_(bias)`, `r.add_(r_bias)` and `y + r`."""
    g = torch.Generator().manual_seed(3)
    shape = (2, 70, 3, 5, 13)
    y = torch.randn(shape, generator=g).to(DEVICE, dtype).contiguous(memory_format=torch.channels_last_3d)
    b = torch.randn(shape[1], generator=g).to(DEVICE, dtype) if bias else None
    r = torch.randn(shape, generator=g).to(DEVICE, dtype) if residual else None
    rb = torch.randn(shape[1], generator=g).to(DEVICE, dtype) if residual_bias else None
    if r is not None and out_layout == "frame_major":
        r = _frame_major(r)
    expected = y.contiguous() if b is None else y.contiguous().add_(b.view(1, -1, 1, 1, 1))
    full_residual = r if rb is None else r + rb.view(1, -1, 1, 1, 1)
    expected = expected + full_residual if r is not None else expected
    strides = expected.stride() if out_layout == "contiguous" else _frame_major(expected).stride()
    actual = triton_epilogue.conv_epilogue(y, b, r, strides, residual_bias=rb)
    assert actual.stride() == tuple(strides)
    assert torch.equal(actual, expected)


def test_causal_conv3d_on_cpu_runs_the_replaced_ops():
    g = torch.Generator().manual_seed(4)
    x, cache = torch.randn(1, 4, 1, 5, 6, generator=g), torch.randn(1, 4, 2, 5, 6, generator=g)
    weight, bias = torch.randn(3, 4, 3, 3, 3, generator=g), torch.randn(3, generator=g)
    residual = torch.randn(1, 3, 1, 5, 6, generator=g)
    out, next_cache = torch.ops.rewrite.causal_conv3d(x, cache, [1, 1, 1, 1, 0, 0], "steady_t1", weight, bias, residual)
    padded = torch.nn.functional.pad(torch.cat([cache, x], 2), [1, 1, 1, 1, 0, 0])
    assert torch.equal(out, torch.nn.functional.conv3d(padded, weight, bias) + residual)
    assert torch.equal(next_cache, torch.cat([cache[:, :, -1:], x], 2))


# ---- GPU: ATen itself ----------------------------------------------------------------------------------
GPU_NORM_SHAPES = [(1, 384, 1, 60, 104), (1, 384, 2, 120, 208), (1, 192, 4, 240, 416), (1, 96, 4, 480, 832),
                   (1, 384, 1, 90, 160), (1, 96, 4, 720, 1280), (1, 512, 2, 90, 160), (1, 256, 4, 360, 640),
                   (2, 96, 3, 17, 33), (1, 40, 1, 7, 9), (1, 384, 1, 31, 53), (1, 16, 1, 5, 5), (3, 8, 2, 4, 6),
                   (1, 384, 60, 104)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_NORM_SHAPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
def test_channel_norm_is_atens_on_this_gpu(shape, layout):
    if layout == "frame_major" and len(shape) == 4:
        pytest.skip("4-D norms (attention) are contiguous")
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    x = _frame_major(x) if layout == "frame_major" else x
    plan = aten_reduction.plan(x, torch.float32)
    assert plan is not None
    assert torch.equal(triton_norm.channel_norm(x, plan.split, plan.ctas),
                       torch.linalg.vector_norm(x.float(), 2, [1], True))


# inputs whose fp32 copy is 2 GiB or more: ATen reduces them in 32-bit pieces (Wan 2.1's last stage at 1088x1920,
# two batches of it, four pieces of 64 channels)
PIECES_NORM_SHAPES = [(1, 96, 4, 1088, 1920), (2, 96, 4, 1088, 1920), (1, 256, 4, 1088, 1920)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", PIECES_NORM_SHAPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
def test_norms_past_32_bit_indexing_are_atens_on_this_gpu(shape, layout):
    x = 3 * torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    x = _frame_major(x) if layout == "frame_major" else x
    plan = aten_reduction.plan(x, torch.float32)
    assert plan is not None
    assert torch.equal(triton_norm.channel_norm(x, plan.split, plan.ctas, plan.pieces),
                       torch.linalg.vector_norm(x.float(), 2, [1], True))
    gamma = (1 + 0.2 * torch.randn(shape[1], 1, 1, 1, device="cuda")).to(torch.bfloat16)
    expected = wan_reference.rms_norm_reference(x, gamma, shape[1] ** 0.5, 0.0, 1e-12, True, "silu")
    assert torch.equal(torch.ops.rewrite.rms_norm(x, gamma, shape[1] ** 0.5, 0.0, 1e-12, True, "silu"), expected)


# Wan 2.2's 1024-channel norms (latent, 2x, 4x at 720p and 480p): ATen splits their channels across blocks
GLOBAL_NORM_SHAPES = [(1, 1024, 1, 45, 80), (1, 1024, 2, 90, 160), (1, 1024, 4, 180, 320), (1, 1024, 1, 30, 52),
                      (1, 1024, 2, 60, 104), (1, 1024, 4, 120, 208), (1, 1024, 3, 45, 80), (2, 1024, 1, 45, 80)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GLOBAL_NORM_SHAPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
def test_channel_norm_split_across_blocks_is_atens_on_this_gpu(shape, layout):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    x = _frame_major(x) if layout == "frame_major" else x
    plan = aten_reduction.plan(x, torch.float32)
    assert plan is not None and plan.ctas > 1
    assert torch.equal(triton_norm.channel_norm(x, plan.split, plan.ctas),
                       torch.linalg.vector_norm(x.float(), 2, [1], True))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GLOBAL_NORM_SHAPES[:3], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_norm_split_across_blocks_is_bit_identical_on_this_gpu(shape, dtype):
    x = 3 * torch.randn(shape, device="cuda", dtype=dtype)
    gamma = (1 + 0.2 * torch.randn(shape[1], 1, 1, 1, device="cuda")).to(dtype)
    upcast = dtype != torch.float32
    expected = wan_reference.rms_norm_reference(x, gamma, 32.0, 0.0, 1e-12, upcast, "silu")
    assert torch.equal(torch.ops.rewrite.rms_norm(x, gamma, 32.0, 0.0, 1e-12, upcast, "silu"), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 96, 4, 480, 832), (1, 384, 1, 60, 104), (2, 96, 3, 17, 33), (1, 384, 1, 31, 53)],
                         ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
def test_fused_rms_norm_is_bit_identical_on_this_gpu(shape, dtype, layout):
    x = 3 * torch.randn(shape, device="cuda", dtype=dtype)
    x = _frame_major(x) if layout == "frame_major" else x
    gamma = (1 + 0.2 * torch.randn(shape[1], 1, 1, 1, device="cuda")).to(dtype)
    upcast = dtype != torch.float32
    for act in ("silu", None):
        expected = wan_reference.rms_norm_reference(x, gamma, shape[1] ** 0.5, 0.0, 1e-12, upcast, act)
        actual = torch.ops.rewrite.rms_norm(x, gamma, shape[1] ** 0.5, 0.0, 1e-12, upcast, act)
        assert actual.stride() == expected.stride()
        assert torch.equal(actual, expected)


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


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frames_of_ncdhw"))
def test_channels_last_upsample_is_exact(dtype, layout):
    x = torch.randn(3, 70, 5, 7, generator=torch.Generator().manual_seed(6)).to(DEVICE, dtype)
    if layout == "frames_of_ncdhw":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    actual = triton_upsample.upsample_nearest2x_channels_last(x)
    assert actual.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(actual, wan_reference.upsample_nearest2x_reference(x, False))


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
    monkeypatch.setattr(triton_pad, "_padded_channels_last", lambda *args: tuple(t.fill_(float("nan")) for t in empty(*args)))
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
