"""Wan Triton kernels against their reference ops: Triton interpreter on CPU, real kernels on CUDA.

On CUDA every kernel is checked with torch.equal. Under the CPU interpreter, pure data movement and the
add kernels are bit-exact too (the kernels round to nearest even there explicitly, as the interpreter
itself truncates to bf16); the RMS-norm epilogue with SiLU is checked within 2 ulp of the output dtype
(bf16: 2**-7 relative; fp16: 2**-10; fp32: 2**-23), because there exp is numpy's, not libdevice's expf.
Any formula slip (a lost rounding point, a missing +0.0, a wrong clamp or index) exceeds that bound by
orders of magnitude.
"""

from __future__ import annotations

import pytest
import torch

from rewrite.ops import dispatch
from rewrite.kernels.epilogue import epilogue as triton_epilogue
from rewrite.kernels.norm import rms_norm as triton_norm
from rewrite.models.wan import reference as wan_reference
from rewrite.models.wan import ops as _wan_ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.ops.dispatch import INTERPRETING, use_backend

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _randn(*shape, dtype=torch.float32, generator=None):
    return torch.randn(*shape, generator=generator).to(DEVICE, dtype)


def _frame_major(t: torch.Tensor) -> torch.Tensor:
    """The same values laid out [b, t, c, h, w] in memory (as Wan's upsampler output is)."""
    return t.permute(0, 2, 1, 3, 4).contiguous().permute(0, 2, 1, 3, 4)


def _strided_columns(t: torch.Tensor) -> torch.Tensor:
    """The same values with every other column of a twice-as-wide tensor: (h, w) planes not contiguous,
    so the kernels take their flat-index fallback instead of the plane kernels."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    return wide[..., ::2]


LAYOUTS = {"contiguous": lambda t: t, "frame_major": _frame_major, "strided_columns": _strided_columns}


def _close_ulps(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    ulp = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]
    return torch.allclose(a.float(), b.float(), rtol=2 * ulp, atol=2 * ulp)


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, exact_on_cpu: bool = True) -> None:
    """torch.equal on CUDA (and on CPU unless `exact_on_cpu` is False); else within 2 ulp (see above)."""
    assert actual.stride() == expected.stride()
    if CUDA or exact_on_cpu:
        assert torch.equal(actual, expected)
    else:
        assert _close_ulps(actual, expected, dtype)


SHAPES = [(1, 3, 1, 5, 7), (2, 8, 2, 3, 33), (1, 5, 4, 9, 1)]  # widths not a multiple of the block
# Several row blocks of one plane (narrow rows: many rows per program) and several column blocks (wide rows).
PAD_SHAPES = SHAPES + [(1, 2, 1, 600, 3), (1, 1, 2, 2, 4200)]


@needs_kernels
@pytest.mark.parametrize("shape", PAD_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frame_major"))
def test_causal_pad_and_next_cache_are_exact(shape, dtype, layout):
    g = torch.Generator().manual_seed(0)
    x = _randn(*shape, dtype=dtype, generator=g)
    x = _frame_major(x) if layout == "frame_major" else x
    b, c, t, h, w = shape
    cache = _randn(b, c, 2, h, w, dtype=dtype, generator=g)
    for mode, cache_arg, pad in (("steady_t1" if t == 1 else "steady", cache, [1, 1, 1, 1, 0, 0]),
                                 ("chunk0", None, [1, 1, 1, 1, 2, 0]), ("steady_t1" if t == 1 else "steady", cache, [0] * 6)):
        expected = wan_reference.causal_conv_input_reference(x, cache_arg, pad, mode)
        with use_backend("triton"):
            actual = torch.ops.rewrite.causal_conv_input(x, cache_arg, pad, mode)
        assert all(torch.equal(a, e) for a, e in zip(actual, expected)), (mode, pad)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", tuple(LAYOUTS))
@pytest.mark.parametrize("shape", ((2, 6, 3, 5, 9), (1, 3, 2, 40, 30)))
def test_bias_residual_is_exact(dtype, layout, shape):
    g = torch.Generator().manual_seed(1)
    y = _randn(*shape, dtype=dtype, generator=g)
    residual = LAYOUTS[layout](_randn(*shape, dtype=dtype, generator=g))
    bias = _randn(shape[1], dtype=dtype, generator=g)
    expected = y.clone().add_(bias.view(1, -1, 1, 1, 1)) + residual
    with use_backend("triton"):
        actual = triton_epilogue.bias_residual(y, bias, residual)
    assert_matches(actual, expected, dtype)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("upcast", (False, True))
@pytest.mark.parametrize("layout", ("contiguous", "frames_of_ncdhw", "channels_last"))
def test_upsample_nearest2x_is_exact(dtype, upcast, layout):
    """Any input strides; the steady graph's input is [t, c, h, w] viewed out of an NCDHW tensor."""
    x = _randn(3, 4, 5, 7, dtype=dtype, generator=torch.Generator().manual_seed(2))
    if layout == "frames_of_ncdhw":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    elif layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    with use_backend("reference"):
        expected = torch.ops.rewrite.upsample_nearest2x(x, upcast)
    with use_backend("triton"):
        actual = torch.ops.rewrite.upsample_nearest2x(x, upcast)
    assert actual.stride() == expected.stride()
    assert torch.equal(actual, expected)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frame_major", "channels_last", "strided_columns"))
@pytest.mark.parametrize("frames", (1, 2, 3))
def test_temporal_interleave_is_exact(dtype, layout, frames):
    g = torch.Generator().manual_seed(4)
    y = _randn(2, 6, frames, 3, 5, dtype=dtype, generator=g)
    y = {"contiguous": lambda t: t, "frame_major": _frame_major, "strided_columns": _strided_columns,
         "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last_3d)}[layout](y)
    with use_backend("reference"):
        expected = torch.ops.rewrite.temporal_interleave(y)
    with use_backend("triton"):
        actual = torch.ops.rewrite.temporal_interleave(y)
    assert actual.stride() == expected.stride()
    assert torch.equal(actual, expected)
    assert torch.equal(actual[:, :, 1::2], y[:, 3:])  # frame 2t + 1 is channel half 1 of frame t


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("factor_t,first_frame", ((2, 0), (2, 1), (1, 0)))
def test_dup_up_add_is_exact(dtype, factor_t, first_frame):
    g = torch.Generator().manual_seed(3)
    b, cin, t, h, w, cout, fs = 1, 4, 2, 3, 5, 8, 2
    repeats = cout * factor_t * fs * fs // cin
    x = _randn(b, cin, t, h, w, dtype=dtype, generator=g)
    unfold = [b, cout, factor_t, fs, fs, t, h, w]
    fold = [b, cout, t * factor_t, h * fs, w * fs]
    main = _randn(b, cout, t * factor_t - first_frame, h * fs, w * fs, dtype=dtype, generator=g)
    with use_backend("reference"):
        expected = torch.ops.rewrite.dup_up_add(main, x, repeats, unfold, fold, first_frame)
    with use_backend("triton"):
        actual = torch.ops.rewrite.dup_up_add(main, x, repeats, unfold, fold, first_frame)
    assert_matches(actual, expected, dtype)


@needs_kernels
@pytest.mark.parametrize("shape", SHAPES + [(2, 6, 5, 7), (1, 3, 2, 40, 30)])  # the last: 2 spatial blocks
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ("silu", None))
@pytest.mark.parametrize("layout", tuple(LAYOUTS))
def test_rms_norm_epilogue(shape, dtype, act, layout):
    g = torch.Generator().manual_seed(4)
    x = _randn(*shape, dtype=dtype, generator=g)
    if layout != "contiguous":
        if x.dim() == 4:
            pytest.skip("4-D norms (attention) are contiguous")
        x = LAYOUTS[layout](x)
    gamma = (1 + 0.2 * _randn(shape[1], *([1] * (x.dim() - 2)), generator=g)).to(dtype)
    upcast = dtype != torch.float32
    scale = shape[1] ** 0.5
    expected = wan_reference.rms_norm_reference(x, gamma, scale, 0.0, 1e-12, upcast, act)
    with use_backend("triton"):
        actual = triton_norm.rms_norm(x, gamma, scale, 0.0, 1e-12, upcast, act, fused_silu=True)
    assert_matches(actual, expected, dtype, exact_on_cpu=act is None)


def test_cpu_tensors_take_the_reference_path_without_the_switch():
    x = torch.randn(1, 2, 1, 3, 3)
    assert not dispatch.use_kernel("rms_norm", (x,), DTYPES)
    with use_backend("reference"):
        assert not dispatch.use_kernel("rms_norm", (x,), DTYPES)


def test_autograd_and_unsupported_dtype_take_the_reference_path():
    x = torch.randn(1, 2, 1, 3, 3, requires_grad=True).to(DEVICE)
    with use_backend("triton" if not CUDA else "auto"):
        reason = dispatch.kernel_unsupported_reason("rms_norm", (x,), DTYPES)
    assert reason is not None and ("autograd" in reason or not (CUDA or INTERPRETING))
    y = torch.randn(1, 2, 1, 3, 3).to(torch.float64)
    reason = dispatch.kernel_unsupported_reason("rms_norm", (y,), DTYPES)
    assert reason is not None
    with pytest.raises(ValueError, match="forced but unsupported"), use_backend("triton"):
        dispatch.use_kernel("rms_norm", (y,), DTYPES)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
def test_silu_self_test_is_bit_identical_on_this_gpu(dtype):
    from rewrite.ops import selftest

    identical, mismatches, tested = selftest.silu_check(torch.device("cuda"), dtype)
    print(f"silu self-test {dtype}: {tested} values, {mismatches} mismatches")
    assert identical


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_conv_bias_as_separate_add_is_bit_identical(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 96, 3, 62, 106, generator=g).to("cuda", dtype)
    w = (0.05 * torch.randn(96, 96, 3, 3, 3, generator=g)).to("cuda", dtype)
    bias = torch.randn(96, generator=g).to("cuda", dtype)
    expected = torch.nn.functional.conv3d(x, w, bias)
    actual = torch.nn.functional.conv3d(x, w).add_(bias.view(1, -1, 1, 1, 1))
    assert torch.equal(actual, expected)
