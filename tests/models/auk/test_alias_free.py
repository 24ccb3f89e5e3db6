"""rewrite::alias_free_snake: reference == eager module, fake impl, Triton kernel within tolerance, dispatch.

The Triton kernel is checked on CPU under the Triton interpreter with the backend forced to "triton":
in this process when ``TRITON_INTERPRET=1`` was set before import (tests/conftest.py does so without
CUDA), else in a subprocess that sets it.

Tolerance of the Triton path (exactness class ``tolerance``), fp32, against the eager module:
``max-abs <= 16 * eps32 * max|y|`` and relative L2 error ``<= 1e-6``. Why: the op sums a 6-term
polyphase upsample (sum of |2 h| over a phase = 1.33) and a 12-term low-pass (sum |h| = 1.33) in another
order than ATen/cuDNN, with FMA contraction; each order is within ~(6 + 12) * 1.33 eps of the exact sum in
the worst case, and SnakeBeta's slope ``1 + exp(alpha - beta) * sin(2 u exp(alpha))`` passes the
upsample error on (a few units for log-scale alpha, beta ~ N(0, 0.5) as used here). Random rounding
errors add up like a random walk, so the difference between the two orders stays at a few eps of the
output scale: measured <= 4.3 eps * max|y| under the interpreter (numpy's sin; 120 random cases) and
<= 2.8 on an H200 (240 cases), relative L2 ~1e-7 (<= 3.1e-7). Eager itself is up to 7 eps * max|y|
from an fp64 evaluation. The bound 16 leaves a 4x margin; an indexing or padding mistake shows up
as errors of the order of the signal, millions of eps.
fp16/bf16 inputs: the kernel computes in fp32 on the rounded inputs and rounds once at the end, so
against the fp32 module on the same rounded values it adds at most half an ulp of the output dtype (a
whole ulp under the interpreter, which truncates to bf16): ``max-abs <= eps_dtype * max|y| + the fp32
bound``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rewrite.models.auk.model import AliasFreeSnakeBeta
from rewrite.ops import dispatch
from rewrite.models.auk import alias_free
from rewrite.models.auk import ops as _auk_ops  # noqa: F401  (registers torch.ops.rewrite.causal_conv1d)
from rewrite.models.auk.alias_free import (
    alias_free_snake,
    alias_free_snake_reference,
    choose_implementation,
    run_triton_kernel,
    triton_unsupported_reason,
    use_backend,
)

REPO = Path(__file__).resolve().parents[3]
FP32_MAX_ABS_EPS = 16  # x eps32 x max|y|
FP32_REL_L2 = 1e-6
INTERPRETER_LENGTHS = (1, 2, 7, 33, 130)


def make_case(channels: int, length: int, batch: int = 2, seed: int = 0, logscale: bool = True,
              dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """A module with seeded non-trivial alpha/beta and an input of ``[batch, channels, length]``."""
    generator = torch.Generator().manual_seed(seed)
    module = AliasFreeSnakeBeta(channels, logscale)
    with torch.no_grad():
        spread = torch.randn(2, channels, generator=generator) * 0.5
        if not logscale:
            spread = spread.exp()
        module.act.alpha.copy_(spread[0])
        module.act.beta.copy_(spread[1])
    x = 2 * torch.randn(batch, channels, length, generator=generator)
    return module.to(device=device, dtype=dtype), x.to(device=device, dtype=dtype)


def op_args(module: AliasFreeSnakeBeta):
    return module.act.alpha, module.act.beta, module.taps


def error_stats(candidate: torch.Tensor, reference: torch.Tensor) -> dict:
    diff = candidate.double() - reference.double()
    scale = reference.double().abs().max().item()
    return {
        "max_abs": diff.abs().max().item(),
        "max_abs_eps": diff.abs().max().item() / (torch.finfo(torch.float32).eps * max(scale, 1e-30)),
        "rel_l2": (diff.norm() / reference.double().norm().clamp_min(1e-30)).item(),
        "scale": scale,
    }


# ---- reference == eager -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(2, 3, 1), (2, 3, 2), (1, 4, 7), (2, 3, 33), (1, 5, 130), (1, 2, 1001)])
@pytest.mark.parametrize("logscale", [True, False])
def test_reference_equals_eager_module(shape, logscale):
    batch, channels, length = shape
    module, x = make_case(channels, length, batch, seed=length, logscale=logscale)
    with torch.no_grad():
        expected = module(x)
        assert torch.equal(alias_free_snake_reference(x, *op_args(module), logscale), expected)
        assert torch.equal(alias_free_snake(x, *op_args(module), logscale), expected)  # CPU: reference path


def test_reference_equals_eager_module_float64_and_bf16():
    for dtype in (torch.float64, torch.bfloat16):
        module, x = make_case(3, 40, dtype=dtype)
        with torch.no_grad():
            assert torch.equal(alias_free_snake(x, *op_args(module)), module(x))


# ---- fake impl and tracing ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_impl_shape_and_dtype(dtype):
    from torch._subclasses.fake_tensor import FakeTensorMode

    module, x = make_case(3, 17, dtype=dtype)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(t) for t in (x, *op_args(module))]
        out = torch.ops.rewrite.alias_free_snake(*fake_args)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()


def test_export_keeps_the_op():
    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.inner = module

        def forward(self, x):
            return alias_free_snake(x, self.inner.act.alpha, self.inner.act.beta, self.inner.taps)

    module, x = make_case(3, 9)
    module.requires_grad_(False)
    program = torch.export.export(Wrapper(module), (x,), strict=False)
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert torch.ops.rewrite.alias_free_snake.default in targets
    with torch.no_grad():
        assert torch.equal(program.module()(x), module(x))


def test_opcheck():
    module, x = make_case(3, 11)
    torch.library.opcheck(torch.ops.rewrite.alias_free_snake.default, (x, *[t.detach() for t in op_args(module)]))


# ---- validation ---------------------------------------------------------------------------------------
def test_bad_inputs_raise_value_error():
    module, x = make_case(3, 8)
    alpha, beta, taps = (t.detach() for t in op_args(module))
    bad = [
        (x[0], alpha, beta, taps),  # rank 2
        (x[..., :0], alpha, beta, taps),  # T = 0
        (x, alpha[:2], beta, taps),  # C mismatch
        (x, alpha, beta, taps[..., :11]),  # 11 taps
        (x, alpha.double(), beta, taps),  # dtype mismatch
    ]
    for args in bad:
        with pytest.raises(ValueError, match="alias_free_snake"):
            alias_free_snake(*args)


# ---- dispatch: the reference path and its reason ------------------------------------------------------
def test_cpu_auto_falls_back_to_reference():
    module, x = make_case(3, 8)
    with torch.no_grad():
        path, reason = choose_implementation(x, *op_args(module))
    assert path == "reference" and "cpu" in reason  # "auto" never takes the interpreter, even when it is on


def test_autograd_needed_falls_back_to_differentiable_reference(kernel_allowed_on_cpu):
    module, x = make_case(3, 20)
    x.requires_grad_(True)
    assert "autograd" in triton_unsupported_reason(x, *op_args(module))
    with torch.no_grad():
        assert triton_unsupported_reason(x, *op_args(module)) is None
    with use_backend("auto"):
        assert choose_implementation(x, *op_args(module))[0] == "reference"
        out = alias_free_snake(x, *op_args(module))
    out.square().sum().backward()
    grads = [t.grad.clone() for t in (x, module.act.alpha, module.act.beta)]
    for t in (x, module.act.alpha, module.act.beta):
        t.grad = None
    module(x).square().sum().backward()
    for got, t in zip(grads, (x, module.act.alpha, module.act.beta)):
        assert torch.equal(got, t.grad)



def test_the_ops_gradients_are_the_eager_modules():
    """Called directly with inputs that need a gradient, both ops differentiate as the eager module does, bit
    for bit (their `register_autograd` runs the reference's aten ops again), for every input that wants one."""
    module, x = make_case(3, 20)
    weight = torch.randn(4, 3, 3, generator=torch.Generator().manual_seed(1))
    bias, residual = torch.randn(4), torch.randn(2, 4, 20)
    inputs = (x, module.act.alpha, module.act.beta, weight, bias, residual)
    for t in inputs:
        t.requires_grad_(True)

    def gradients(call):
        for t in inputs:
            t.grad = None
        call().square().sum().backward()
        return [t.grad.clone() for t in inputs[:3]]

    assert all(torch.equal(a, b) for a, b in zip(
        gradients(lambda: torch.ops.rewrite.alias_free_snake.default(x, *op_args(module), True)),
        gradients(lambda: module(x))))
    conv = lambda t: torch.nn.functional.conv1d(torch.nn.functional.pad(t, (4, 0)), weight, bias, dilation=[2])  # noqa: E731
    fused = gradients(lambda: torch.ops.rewrite.alias_free_snake_causal_conv1d.default(
        x, *op_args(module), True, weight, bias, [2], residual))
    fused_rest = [weight.grad.clone(), bias.grad.clone(), residual.grad.clone()]
    eager = gradients(lambda: residual + conv(module(x)))
    assert all(torch.equal(a, b) for a, b in zip(fused, eager))
    assert all(torch.equal(a, b) for a, b in zip(fused_rest, (weight.grad, bias.grad, residual.grad)))

def test_unsupported_dtype_and_layout_reasons(kernel_allowed_on_cpu):
    with torch.no_grad():
        module, x = make_case(3, 8, dtype=torch.float64)
        assert "dtype" in triton_unsupported_reason(x, *op_args(module))
        module, x = make_case(3, 8)
        strided = x.transpose(1, 2).contiguous().transpose(1, 2)  # served: copied to contiguous first
        assert triton_unsupported_reason(strided, *op_args(module)) is None
        assert choose_implementation(x, *op_args(module)) == ("triton", None)
        if alias_free.INTERPRETING:  # CPU kernels run here (the fixture only pretends for the dispatch checks)
            assert torch.equal(alias_free_snake(strided, *op_args(module)), alias_free_snake(x, *op_args(module)))


def test_backend_switch():
    module, x = make_case(3, 8)
    with torch.no_grad(), use_backend("reference"):
        assert choose_implementation(x, *op_args(module)) == ("reference", "backend switch set to 'reference'")
    if not alias_free.INTERPRETING:
        with torch.no_grad(), use_backend("triton"), pytest.raises(ValueError, match="forced"):
            alias_free_snake(x, *op_args(module))
    assert dispatch.get_backend() == "auto"


# ---- the Triton kernel under the interpreter ----------------------------------------------------------
def interpreter_report() -> list[dict]:
    """Kernel vs the fp32 module, per length and dtype (needs TRITON_INTERPRET=1 at import)."""
    assert alias_free.INTERPRETING, "TRITON_INTERPRET=1 was not seen at import"
    report = []
    with torch.no_grad(), use_backend("triton"):  # forced: a fallback would raise
        for length in INTERPRETER_LENGTHS:
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                module, x = make_case(3, length, batch=2, seed=length, dtype=dtype)
                path = choose_implementation(x, *op_args(module))[0]
                out = alias_free_snake(x, *op_args(module))
                expected = module.float()(x.float())  # fp32 math on the same (rounded) values
                report.append({"length": length, "dtype": str(dtype), "path": path,
                               "out_dtype": str(out.dtype), **error_stats(out, expected)})
    return report


def _dtype_bound(dtype: str, scale: float) -> float:
    eps32 = torch.finfo(torch.float32).eps
    rounding = {"torch.float32": 0.0, "torch.float16": torch.finfo(torch.float16).eps,
                "torch.bfloat16": torch.finfo(torch.bfloat16).eps}[dtype]
    return (rounding + FP32_MAX_ABS_EPS * eps32) * scale


@pytest.fixture(scope="module")
def interpreter_results():
    """In this process when the interpreter is on (tests/conftest.py turns it on without CUDA), else
    in a subprocess with TRITON_INTERPRET=1 (it must be set before triton.jit decorates the kernel)."""
    pytest.importorskip("triton")
    if alias_free.INTERPRETING:
        return interpreter_report()
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    code = ("import json; from tests.models.auk.test_alias_free import interpreter_report; "
            "print(json.dumps(interpreter_report()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_triton_interpreter_matches_reference(interpreter_results):
    assert len(interpreter_results) == 3 * len(INTERPRETER_LENGTHS)
    for row in interpreter_results:
        assert row["path"] == "triton" and row["out_dtype"] == row["dtype"], row
        assert row["max_abs"] <= _dtype_bound(row["dtype"], row["scale"]), row
        if row["dtype"] == "torch.float32":
            assert row["rel_l2"] <= FP32_REL_L2, row


# ---- on CUDA (skipped without a device) ---------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_reference_is_exact_and_triton_within_tolerance(dtype):
    shapes = [(2, 3, 1), (2, 3, 2), (2, 3, 7), (2, 3, 33), (2, 3, 130), (1, 96, 3001), (2, 24, 20000)]
    for batch, channels, length in shapes:
        module, x = make_case(channels, length, batch, seed=length, dtype=dtype, device="cuda")
        with torch.no_grad():
            assert torch.equal(alias_free_snake_reference(x, *op_args(module)), module(x))
            assert choose_implementation(x, *op_args(module)) == ("triton", None)
            out = alias_free_snake(x, *op_args(module))
            stats = error_stats(out, module.float()(x.float()))
        assert out.dtype == dtype
        assert stats["max_abs"] <= _dtype_bound(str(dtype), stats["scale"]), (length, stats)
        if dtype == torch.float32:
            assert stats["rel_l2"] <= FP32_REL_L2, (length, stats)


@pytest.mark.gpu
def test_cuda_autograd_falls_back():
    module, x = make_case(3, 50, device="cuda")
    path, reason = choose_implementation(x, *op_args(module))  # parameters require grad, grad mode on
    assert path == "reference" and "autograd" in reason
    assert torch.equal(alias_free_snake(x, *op_args(module)), module(x))


# ---------------------------------------------------------------------------------- activation -> causal conv
KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(not (torch.cuda.is_available() or alias_free.INTERPRETING),
                                  reason="needs CUDA or TRITON_INTERPRET=1")


@needs_kernel
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_left_zero_margin_is_the_plain_output_shifted(dtype):
    """`left_zeros` changes where the kernel writes, nothing it computes: torch.equal, zeros in front."""
    with torch.no_grad():
        module, x = make_case(3, 40, dtype=dtype, device=KERNEL_DEVICE)
        plain = run_triton_kernel(x, *op_args(module))
        padded = run_triton_kernel(x, *op_args(module), left_zeros=10)
    assert padded.shape == (x.shape[0], x.shape[1], 10 + x.shape[2])
    assert torch.equal(padded[..., 10:], plain) and not padded[..., :10].any()


@needs_kernel
@pytest.mark.parametrize("with_bias, with_residual, with_x_bias",
                         [(True, True, False), (True, False, False), (False, False, False), (True, True, True),
                          (True, False, True)])
def test_snake_causal_conv_equals_the_ops_it_fuses(with_bias, with_residual, with_x_bias):
    """Same activation kernel, same conv on the same values and layout: bit-identical to the separate ops
    (the deferred input bias read as ``x + x_bias`` rounded; with a residual, on CUDA the conv's bias and the
    residual added by one kernel with ATen's roundings, on the CPU, where oneDNN may fold the bias into the
    sum differently per instruction set, the conv keeping its bias: equal by construction on every CPU)."""
    from rewrite.models.auk.alias_free import alias_free_snake_causal_conv1d_reference

    module, x = make_case(3, 40, device=KERNEL_DEVICE)
    g = torch.Generator().manual_seed(7)
    weight = (torch.randn(5, 3, 7, generator=g) * 0.2).to(KERNEL_DEVICE)
    bias = torch.randn(5, generator=g).to(KERNEL_DEVICE) if with_bias else None
    residual = torch.randn(x.shape[0], 5, x.shape[2], generator=g).to(KERNEL_DEVICE) if with_residual else None
    x_bias = torch.randn(3, generator=g).to(KERNEL_DEVICE) if with_x_bias else None
    args = (*op_args(module), True, weight, bias, [3], residual, x_bias)
    cropped = torch.cat([x, torch.full_like(x[..., :9], float("nan"))], dim=2)[..., : x.shape[2]]  # rows of a view
    with torch.no_grad(), use_backend("triton"):
        fused = torch.ops.rewrite.alias_free_snake_causal_conv1d(x, *args)
        source = x if x_bias is None else x + x_bias.view(1, -1, 1)
        pair = torch.ops.rewrite.causal_conv1d(alias_free_snake(source, *op_args(module)), weight, bias, [3], residual)
        strided = torch.ops.rewrite.alias_free_snake_causal_conv1d(x.transpose(1, 2).contiguous().transpose(1, 2), *args)
        from_view = torch.ops.rewrite.alias_free_snake_causal_conv1d(cropped, *args)
    assert torch.equal(fused, pair) and torch.equal(strided, fused) and torch.equal(from_view, fused)
    with torch.no_grad(), use_backend("reference"):  # the reference: the reference ops
        assert torch.equal(torch.ops.rewrite.alias_free_snake_causal_conv1d(x, *args),
                           alias_free_snake_causal_conv1d_reference(x, *args))


@needs_kernel
@pytest.mark.parametrize("channels", (6, 24, 48), ids=lambda c: f"C{c}")
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_channels_last_output_is_the_plain_output_transposed(channels, dtype):
    """``channels_last_out`` changes where the kernel writes (``[B, left + T, C]``), nothing it computes; with
    ``round_tf32`` the values are the plain ones rounded to TF32 (for the conv that reads them)."""
    from tests.kernels.conv1d.test_conv1d import tf32

    with torch.no_grad():
        module, x = make_case(channels, 150, dtype=dtype, device=KERNEL_DEVICE)
        plain = run_triton_kernel(x, *op_args(module), left_zeros=12)
        last = run_triton_kernel(x, *op_args(module), left_zeros=12, channels_last_out=True)
        assert last.shape == (x.shape[0], 12 + x.shape[2], channels) and last.is_contiguous()
        assert torch.equal(last.transpose(1, 2), plain)
        if dtype == torch.float32:
            rounded = run_triton_kernel(x, *op_args(module), left_zeros=12, channels_last_out=True, round_tf32=True)
            assert torch.equal(rounded.transpose(1, 2), tf32(plain)) and not torch.equal(rounded, last)
        else:
            with pytest.raises(ValueError, match="round_tf32 needs an fp32"):
                run_triton_kernel(x, *op_args(module), round_tf32=True)
        with pytest.raises(ValueError, match="to divide C"):
            run_triton_kernel(x, *op_args(module), channels_last_out=True, launch=(4 * channels, 16, 1))


@needs_kernel
@pytest.mark.parametrize("with_residual, with_x_bias", ((True, False), (False, True)))
def test_snake_causal_conv_runs_the_triton_conv_where_chosen(with_residual, with_x_bias):
    """With 16+ output channels the op runs the activation channels-last, TF32-rounded, and the Triton conv:
    torch.equal to those two calls, and within the conv's TF32 tolerance of the separate reference ops
    (``|error| <= 2**-10 * (|w| * |act|)``: each TF32 operand carries a relative rounding error of at most
    2**-11, a product at most 2**-10; the fp32 sum's own error is far below), plus the activation's own bound
    (``FP32_MAX_ABS_EPS`` eps32 max|act|) passed through the conv (times the largest ``sum |w|`` of an output)."""
    from rewrite.kernels.conv1d import conv1d as triton_conv1d
    from rewrite.models.auk.alias_free import alias_free_snake_causal_conv1d_reference

    module, x = make_case(24, 60, device=KERNEL_DEVICE)
    g = torch.Generator().manual_seed(3)
    weight = (torch.randn(24, 24, 3, generator=g) * 0.2).to(KERNEL_DEVICE)
    bias = torch.randn(24, generator=g).to(KERNEL_DEVICE)
    residual = torch.randn(x.shape[0], 24, x.shape[2], generator=g).to(KERNEL_DEVICE) if with_residual else None
    x_bias = torch.randn(24, generator=g).to(KERNEL_DEVICE) if with_x_bias else None
    assert triton_conv1d.chosen(weight, x.dtype, 5)
    args = (*op_args(module), True, weight, bias, [5], residual, x_bias)
    with torch.no_grad(), use_backend("triton"):
        fused = torch.ops.rewrite.alias_free_snake_causal_conv1d(x, *args)
        activation = run_triton_kernel(x, *op_args(module), left_zeros=10, x_bias=x_bias, channels_last_out=True,
                                       round_tf32=True)
        direct = triton_conv1d.causal_conv1d(activation, triton_conv1d.pack_weight(weight), bias, 5, residual)
        separate = alias_free_snake_causal_conv1d_reference(x, *args)
        source = x if x_bias is None else x + x_bias.view(1, -1, 1)
        act = torch.nn.functional.pad(alias_free_snake(source, *op_args(module)), (10, 0)).double()
    assert torch.equal(fused, direct)
    magnitude = torch.nn.functional.conv1d(act.abs(), weight.double().abs(), dilation=5)
    activation_bound = FP32_MAX_ABS_EPS * torch.finfo(torch.float32).eps * act.abs().max()
    activation_bound = activation_bound * weight.double().abs().sum(dim=(1, 2)).max()
    assert ((fused.double() - separate.double()).abs() <= 2 ** -10 * magnitude + activation_bound).all()


def test_rows_stride_accepts_row_cropping_views_only():
    from rewrite.models.auk.alias_free import rows_stride

    full = torch.zeros(2, 3, 10)
    assert rows_stride(full) == 10 and rows_stride(full[..., :7]) == 10 and rows_stride(full[:1, :1, :4]) == 4
    assert rows_stride(full.transpose(1, 2).contiguous().transpose(1, 2)) is None  # channels-last rows
    assert rows_stride(full[:, :2]) is None  # batch stride is not channels * row stride
    assert rows_stride(full[..., ::2]) is None


@needs_kernel
@pytest.mark.parametrize("channels_last", (False, True), ids=("ncl", "channels-last"))
def test_a_valid_frame_limit_skips_time_blocks_past_it_and_changes_nothing_before(channels_last):
    """Inside `valid_length.valid_frames`, time blocks whose first output lies at or past the limit return at
    once; block 0 still writes the zero margin and every output before the limit is the unlimited one."""
    from rewrite.kernels import valid_length

    with torch.no_grad():
        module, x = make_case(8, 400, device=KERNEL_DEVICE)  # 400 positions of a 50-frame window: 8 per frame
        kwargs = dict(left_zeros=6, channels_last_out=channels_last)
        whole = run_triton_kernel(x, *op_args(module), **kwargs)
        frames = torch.tensor([10], dtype=torch.int32, device=KERNEL_DEVICE)
        with valid_length.valid_frames(frames, 50, 3):  # positions below (10 + 3) * 8 = 104
            assert valid_length.kernel_args(400, x.device)[1:] == (8, 24)
            limited = run_triton_kernel(x, *op_args(module), **kwargs)
    axis = 1 if channels_last else 2
    assert torch.equal(limited.narrow(axis, 0, 6 + 104), whole.narrow(axis, 0, 6 + 104))
