"""rewrite::alias_free_snake_exact's Triton path (`rewrite.kernels.alias_free.exact`): exactness and routing.

On CPU the kernels run under the Triton interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1`` without
CUDA) with the backend forced to "triton". There the kernel's ``sin`` is numpy's float32 sine, which is not
ATen's CPU sine (they differ by an ulp on some inputs), so the interpreter checks are:

- exact (``torch.equal``) against the reference with numpy's sine put in place of ``aten.sin``: this checks
  every other step (the x2, the crop, each rounding to the activation dtype, the operand order, the pads)
  bit for bit;
- bit-exact data movement: the pad kernel against ``F.pad``, and the (11, 0) pad columns of the SnakeBeta
  kernel against its own column 11;
- against the true reference within ``|diff| <= 4 * eps_dtype * (inv_b + |v|)`` elementwise. Why: numpy's and
  ATen's CPU float32 sines differ by at most one ulp (measured over 4M arguments ~ 8 N(0, 1), numpy 2.4: 15%
  differ, none by more), i.e. a relative eps32; in fp16/bf16 the rounded sines then differ by at most one
  ulp of the dtype, a relative eps_dtype. Squaring doubles the relative difference and the rounding of the
  square and of the product with ``inv_b`` may each flip by one more ulp, so ``w = inv_b * s**2`` (at most
  ``inv_b``) moves by <= 4 eps_dtype * w, and the final add may flip the rounding of ``v`` by <= eps_dtype
  * |v|. Measured: <= 1.8 (fp32), 0 (fp16, bf16). The whole op adds the low-pass (sum |h| = 1.33) and its
  own roundings on the two different inputs: bound ``8 * eps_dtype * sum|h| * (max inv_b + max|v|)``,
  measured <= 0.6 of ``eps_dtype * sum|h| * (...)``.

On CUDA (``gpu`` marker; run on a GPU machine with ``python -m pytest -m gpu``) the Triton path must be
``torch.equal`` to the reference for fp32, fp16 and bf16: on the six full-size AuK activation shapes (a 5 s,
250-frame clip) and on random shapes, with alpha/beta ~ N(0, 0.5) and x ~ 2 N(0, 1).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rewrite.models.auk.model import AuKConfig, kaiser_sinc_taps
from rewrite.ops import dispatch
from rewrite.models.auk import ops as auk
from rewrite.kernels.alias_free import exact as triton_auk
from rewrite.models.auk.ops import (
    alias_free_snake_exact,
    alias_free_snake_exact_reference,
    choose_exact_implementation,
    exact_kernel_unsupported_reason,
)
from rewrite.ops.dispatch import INTERPRETING, use_backend

aten = torch.ops.aten
CUDA = torch.cuda.is_available()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SNAKE_BOUND = 4  # x eps_dtype x (inv_b + |v|), interpreter only (module docstring)

needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")
needs_interpreter = pytest.mark.skipif(not INTERPRETING, reason="needs TRITON_INTERPRET=1 (set without CUDA)")


def make_inputs(batch: int, channels: int, length: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0,
                logscale: bool = True):
    """x ~ 2 N(0, 1); alpha, beta ~ N(0, 0.5) (exp'd to positive values when not log-scale); AuK's taps."""
    generator = torch.Generator().manual_seed(seed)
    alpha, beta = torch.randn(2, channels, generator=generator) * 0.5
    if not logscale:
        alpha, beta = alpha.exp(), beta.exp()
    x = 2 * torch.randn(batch, channels, length, generator=generator)
    taps = kaiser_sinc_taps().view(1, 1, -1)
    return [t.to(device=device, dtype=dtype) for t in (x, alpha, beta, taps)]


def same_bits(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Bitwise equality (signed zeros told apart), any NaN equal to any NaN."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[actual.element_size()]
    same = (actual.view(ints) == expected.view(ints)) | (actual.isnan() & expected.isnan())
    return bool(same.all())


def numpy_sin(t: torch.Tensor) -> torch.Tensor:
    """What the interpreter's ``tl.sin`` computes: numpy's float32 sine, rounded to t's dtype."""
    return torch.from_numpy(np.sin(t.float().contiguous().numpy())).to(t.dtype)


class _NumpySineAten:
    """``torch.ops.aten`` with ``sin.default`` replaced by `numpy_sin` (for the reference under the interpreter)."""

    sin = SimpleNamespace(default=numpy_sin)

    def __getattr__(self, name):
        return getattr(torch.ops.aten, name)


def snake_inputs(x, alpha, beta, taps, logscale=True):
    """(up, a, inv_b): the reference's transposed-conv output and per-channel parameters."""
    channels = x.shape[1]
    padded = aten.pad.default(x, [auk.UP_PAD, auk.UP_PAD], "replicate")
    up = aten.conv_transpose1d.default(padded, aten.expand.default(taps, [channels, -1, -1]), None,
                                       [auk.RESAMPLE_RATIO], [0], [0], channels)
    a, b = alpha.view(1, -1, 1), beta.view(1, -1, 1)
    if logscale:
        a, b = a.exp(), b.exp()
    inv_b = aten.mul.Tensor(aten.reciprocal.default(aten.add.Tensor(b, auk.SNAKE_EPS)), 1.0)
    return up, a, inv_b


def reference_vpad(up, a, inv_b, sin=aten.sin.default):
    """The reference's input to its final conv1d: ``pad(u + inv_b * sin(u * a)**2, (11, 0), "replicate")``."""
    u = aten.slice.Tensor(aten.mul.Tensor(up, auk.RESAMPLE_RATIO), 2, auk.UP_CROP, -auk.UP_CROP)
    v = aten.add.Tensor(u, aten.mul.Tensor(inv_b, aten.pow.Tensor_Scalar(sin(aten.mul.Tensor(u, a)), 2)))
    return aten.pad.default(v, [auk.DOWN_PAD, 0], "replicate")


# ---- replicate pad: pure data movement, bit-exact everywhere -----------------------------------------------
@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [1, 2, 7, 1000, 2100])
@pytest.mark.parametrize("pads", [(5, 5), (11, 0), (0, 3), (0, 0)])
def test_replicate_pad_is_f_pad_bitwise(dtype, length, pads):
    device = "cuda" if CUDA else "cpu"
    x = make_inputs(2, 3, length, dtype, device, seed=length)[0]
    x[0, 0, 0], x[1, 2, -1] = -0.0, float("nan")  # signed zero and NaN travel as bits
    if length > 2:
        x[0, 1, 1] = float("-inf")
    with torch.no_grad(), use_backend("triton"):
        out = triton_auk.replicate_pad1d(x, *pads)
    assert same_bits(out, F.pad(x, pads, mode="replicate"))


@needs_kernels
def test_kernels_reject_bad_layouts():
    x = torch.zeros(2, 3, 8, device="cuda" if CUDA else "cpu")
    with pytest.raises(ValueError, match="contiguous"):
        triton_auk.replicate_pad1d(x.transpose(1, 2), 5, 5)
    with pytest.raises(ValueError, match="T >= 1"):
        triton_auk.replicate_pad1d(x[..., :0], 5, 5)
    with pytest.raises(ValueError, match="C=3"):
        triton_auk.snake_exact(x, torch.ones(2, device=x.device), torch.ones(3, device=x.device), 2, 1, 1)


# ---- SnakeBeta kernel under the interpreter -----------------------------------------------------------------
@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 1), (2, 3, 2), (1, 4, 7), (1, 2, 1000), (1, 2, 1100)])
@pytest.mark.parametrize("logscale", [True, False])
def test_snake_kernel_interpreter(dtype, shape, logscale):
    x, alpha, beta, taps = make_inputs(*shape, dtype, seed=shape[-1], logscale=logscale)
    up, a, inv_b = snake_inputs(x, alpha, beta, taps, logscale)
    with torch.no_grad(), use_backend("triton"):
        out = triton_auk.snake_exact(up, a, inv_b, auk.RESAMPLE_RATIO, auk.UP_CROP, auk.DOWN_PAD)
    assert out.shape == (shape[0], shape[1], 2 * shape[2] + auk.DOWN_PAD) and out.is_contiguous()
    # every step but the sine, bit for bit
    assert same_bits(out, reference_vpad(up, a, inv_b, sin=numpy_sin))
    # the replicate pad repeats the kernel's own first SnakeBeta value
    pad = auk.DOWN_PAD
    assert same_bits(out[..., :pad], out[..., pad:pad + 1].expand(-1, -1, pad))
    # the true reference (ATen's CPU sine), within the stated bound
    expected = reference_vpad(up, a, inv_b)
    diff = (out.double() - expected.double()).abs()
    bound = SNAKE_BOUND * torch.finfo(dtype).eps * (inv_b.double().abs() + expected.double().abs())
    assert bool((diff <= bound).all()), (diff / bound).max().item()


# ---- the whole op through dispatch --------------------------------------------------------------------------
def tiny_activation_shapes(frames: int = 2) -> list[tuple[int, int, int]]:
    """[B, C, T] of the tiny AuK config's activations: each stage's channels at its sample count."""
    config = AuKConfig.tiny()
    lengths = [frames * math.prod(config.upsample_rates[: i + 1]) for i in range(len(config.upsample_rates))]
    return [(1, c, t) for c, t in zip(config.stage_channels(), lengths)]


@needs_interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_op_through_dispatch_on_tiny_model_shapes(dtype, monkeypatch):
    for shape in tiny_activation_shapes():
        x, alpha, beta, taps = make_inputs(*shape, dtype, seed=shape[1])
        with torch.no_grad(), use_backend("triton"):
            assert choose_exact_implementation(x, alpha, beta, taps) == ("triton", None)
            out = alias_free_snake_exact(x, alpha, beta, taps, True)
        expected = alias_free_snake_exact_reference(x, alpha, beta, taps, True)
        assert out.shape == x.shape and out.dtype == dtype
        with monkeypatch.context() as patch:  # the same reference, numpy's sine: bit-identical
            patch.setattr(auk, "aten", _NumpySineAten())
            assert same_bits(out, alias_free_snake_exact_reference(x, alpha, beta, taps, True)), shape
        # against ATen's sine: the SnakeBeta bound carried through the low-pass (sum |h| = 1.33) plus the
        # low-pass's own roundings on the two (different) inputs (module docstring)
        up, a, inv_b = snake_inputs(x, alpha, beta, taps)
        scale = inv_b.double().abs().max().item() + reference_vpad(up, a, inv_b).double().abs().max().item()
        bound = (SNAKE_BOUND + 4) * torch.finfo(dtype).eps * taps.double().abs().sum().item() * scale
        assert (out.double() - expected.double()).abs().max().item() <= bound, shape


# ---- routing: when the reference runs, and why --------------------------------------------------------------
def test_cpu_auto_runs_the_reference():
    x, alpha, beta, taps = make_inputs(2, 3, 20, torch.float32)
    with torch.no_grad():
        path, reason = choose_exact_implementation(x, alpha, beta, taps)
        assert path == "reference" and "cpu" in reason  # "auto" never takes the interpreter
        assert torch.equal(alias_free_snake_exact(x, alpha, beta, taps, True),
                           alias_free_snake_exact_reference(x, alpha, beta, taps, True))


def test_autograd_needed_runs_the_reference(kernel_allowed_on_cpu):
    x, alpha, beta, taps = make_inputs(2, 3, 20, torch.float32)
    alpha.requires_grad_(True)
    assert "autograd" in exact_kernel_unsupported_reason(x, alpha, beta, taps)
    with torch.no_grad():
        assert exact_kernel_unsupported_reason(x, alpha, beta, taps) is None
    with use_backend("auto"):
        assert choose_exact_implementation(x, alpha, beta, taps)[0] == "reference"
        with torch.no_grad():
            expected = alias_free_snake_exact_reference(x, alpha, beta, taps, True)
            assert torch.equal(alias_free_snake_exact(x, alpha, beta, taps, True), expected)


@needs_interpreter  # it runs the kernels on CPU tensors (the fixture only pretends the interpreter is on)
def test_unsupported_inputs_give_reasons(kernel_allowed_on_cpu):
    with torch.no_grad():
        x, alpha, beta, taps = make_inputs(2, 3, 20, torch.float64)
        assert "dtype" in exact_kernel_unsupported_reason(x, alpha, beta, taps)
        with pytest.raises(ValueError, match="forced but unsupported"):
            alias_free_snake_exact(x, alpha, beta, taps, True)
        with use_backend("auto"):  # float64 -> the reference
            assert choose_exact_implementation(x, alpha, beta, taps)[0] == "reference"
            assert torch.equal(alias_free_snake_exact(x, alpha, beta, taps, True),
                               alias_free_snake_exact_reference(x, alpha, beta, taps, True))
        x, alpha, beta, taps = make_inputs(2, 3, 20, torch.float32)
        strided = x.transpose(1, 2).contiguous().transpose(1, 2)  # served: copied to contiguous first
        assert exact_kernel_unsupported_reason(strided, alpha, beta, taps) is None
        assert torch.equal(alias_free_snake_exact(strided, alpha, beta, taps, True),
                           alias_free_snake_exact(x, alpha, beta, taps, True))
        assert "alpha" in exact_kernel_unsupported_reason(x, alpha.half(), beta, taps)
        assert "taps" in exact_kernel_unsupported_reason(x, alpha, beta, taps[..., :11])
        assert "non-empty" in exact_kernel_unsupported_reason(x[..., :0], alpha, beta, taps)
        assert choose_exact_implementation(x, alpha, beta, taps) == ("triton", None)
        with use_backend("reference"):
            assert choose_exact_implementation(x, alpha, beta, taps) == (
                "reference", "backend switch set to 'reference'")
    assert dispatch.get_backend() == "triton"


# ---- on CUDA: bit-identical to the reference (skipped without a device) -------------------------------------
def full_size_activation_shapes(frames: int = 250) -> list[tuple[int, int, int]]:
    """[B, C, T] of the released AuK decoder's activations for a 250-frame (5 s) latent: six stages, C from
    768 to 24, T = frames x the product of the upsample rates so far (1250 ... 120000)."""
    config = AuKConfig()
    lengths = [frames * math.prod(config.upsample_rates[: i + 1]) for i in range(len(config.upsample_rates))]
    return [(1, c, t) for c, t in zip(config.stage_channels(), lengths)]


RANDOM_SHAPES = [(1, 1, 1), (2, 3, 2), (3, 5, 7), (2, 7, 33), (1, 16, 1001), (2, 4, 1018), (1, 3, 4097),
                 (4, 2, 20000), (2, 96, 3001)]


def _assert_triton_path_exact(shape, dtype, seed, logscale=True, scale=1.0):
    x, alpha, beta, taps = make_inputs(*shape, dtype, "cuda", seed=seed, logscale=logscale)
    x = x * scale
    with torch.no_grad():
        assert choose_exact_implementation(x, alpha, beta, taps) == ("triton", None)
        out = alias_free_snake_exact(x, alpha, beta, taps, logscale)
        expected = alias_free_snake_exact_reference(x, alpha, beta, taps, logscale)
        up, a, inv_b = snake_inputs(x, alpha, beta, taps, logscale)
        vpad = triton_auk.snake_exact(up, a, inv_b, auk.RESAMPLE_RATIO, auk.UP_CROP, auk.DOWN_PAD)
        vpad_expected = reference_vpad(up, a, inv_b)
    assert same_bits(vpad, vpad_expected), (shape, dtype, (vpad != vpad_expected).sum().item())
    assert same_bits(out, expected), (shape, dtype, (out != expected).sum().item())
    if scale == 1.0:
        assert torch.equal(out, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_full_size_shapes_bit_identical(dtype):
    for shape in full_size_activation_shapes():
        _assert_triton_path_exact(shape, dtype, seed=shape[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_random_shapes_bit_identical(dtype):
    for index, shape in enumerate(RANDOM_SHAPES):
        _assert_triton_path_exact(shape, dtype, seed=100 + index)
        _assert_triton_path_exact(shape, dtype, seed=200 + index, logscale=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_large_and_tiny_arguments_bit_identical(dtype):
    """sinf's slow argument reduction (|u * a| > 105615), fp16 overflow to inf/NaN, and tiny values (fp32 and
    bf16 subnormals at 1e-38: ATen keeps them, so the kernel must not flush them)."""
    for scale in (1e4, 3e5, 1e-3, 1e-20, 1e-38):
        _assert_triton_path_exact((2, 8, 3001), dtype, seed=7, scale=scale)


@pytest.mark.gpu
def test_cuda_autograd_runs_the_reference():
    x, alpha, beta, taps = make_inputs(2, 3, 50, torch.float32, "cuda")
    alpha.requires_grad_(True)
    path, reason = choose_exact_implementation(x, alpha, beta, taps)
    assert path == "reference" and "autograd" in reason
