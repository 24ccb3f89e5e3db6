"""The one-kernel RMS norm of the Wan ops (ATen's summation order).

CPU, Triton interpreter: the channel-norm kernel is `torch.equal` to a float64 emulation of the order that
`rewrite.kernels.norm.aten_reduction` describes (fma chains per accumulator, then the fixed combination; each step
rounded to fp32: the interpreter's fma rounds once, the emulation rounds the exact float64 product-sum once,
so both are the same fp32 value unless float64 itself rounded, which these inputs do not hit); the fused
norm's epilogue then equals ATen's CPU epilogue ops applied to that norm (bit-exact without SiLU; with SiLU
within 2 ulp, as numpy's exp is not libdevice's).
GPU (`gpu` marker): the norm against ATen's `linalg_vector_norm` and the fused norm against the reference
ops with `torch.equal`, over the shape classes of the Wan decoders. The plan of ATen's reduction is tested in
tests/kernels/norm/test_aten_reduction.py, the ops that use the norm in tests/models/wan/test_fused_ops.py.
"""

from __future__ import annotations

import pytest
import torch

from rewrite.kernels.norm import aten_reduction
from rewrite.kernels.norm import rms_norm as triton_norm
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.models.wan import reference as wan_reference
from rewrite.models.wan import ops as _wan_ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.ops.dispatch import INTERPRETING


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
