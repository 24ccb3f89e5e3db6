"""The AuK decoder's alias-free SnakeBeta activation as one custom op: ``rewrite::alias_free_snake``.

Computes (``AliasFreeSnakeBeta.forward`` of `rewrite.models.auk`, DESIGN 3.3), for ``x`` of shape
``[B, C, T]``, per-channel ``alpha``/``beta`` of shape ``[C]`` and the 12 Kaiser-sinc ``taps``::

    u = 2 * conv_transpose1d(replicate_pad(x, 5, 5), taps, stride=2, groups=C)[..., 15:-15]   # [B, C, 2T]
    v = u + 1 / (exp(beta) + 1e-9) * sin(u * exp(alpha)) ** 2                                 # SnakeBeta
    y = conv1d(replicate_pad(v, 11, 0), taps, stride=2, groups=C)                             # [B, C, T]

(``exp`` only with ``logscale=True``, the AuK default.) The ratio 2, the 12 taps, the pads (5, 5) and
(11, 0) and the crop 15 are fixed by the AuK geometry (`rewrite.ops.alias_free_geometry`, which the model
reads too): they are constants of the op. The
up- and down-sampler share one filter (the module's ``taps`` buffer), so the op takes it once.

Implementations:

- reference (`alias_free_snake_reference`): the aten calls the eager module makes, in its order and
  dtypes, so it is ``torch.equal`` to the module on every device and dtype.
- Triton (`run_triton_kernel`): one pass, no intermediate in global memory. In polyphase form, with
  ``h`` the taps and ``clamp`` the replicate padding (input indices clamped into ``[0, T-1]``)::

      u(2p)     = 2 * sum_q h[2q+1] * x[clamp(p + 2 - q)]     q = 0..5
      u(2p - 1) = 2 * sum_q h[2q]   * x[clamp(p + 2 - q)]     (the same six inputs)
      y[m]      = sum_q h[2q+1] * v(2(m+q-5)) + h[2q] * v(2(m+q-5) - 1)

  and the causal low-pass reads ``v(j)`` for ``j < 0`` as ``v(0)`` (its replicate pad is applied to the
  SnakeBeta *output*, so it repeats ``v(0)``, not ``v`` of a clamped input). A program owns a tile of
  ``BLOCK_R`` rows (of ``B*C``) and ``BLOCK_T`` positions; it computes ``v(2p)`` and ``v(2p-1)`` once
  per position in registers (two sines per output sample) and shifts them along the tile with
  ``tl.gather``; tiles overlap by a halo of 8 positions. Math is fp32 whatever the input dtype
  (fp32, fp16, bf16); the output has the input dtype.

Exactness: ``tolerance`` (enabled at level ``channels_last``). The Triton path sums the 6-term
upsample and the 12-term low-pass in its own order, with FMA contraction, where cuDNN uses another
order, so it is not bit-identical. The exponentials are libdevice's ``expf`` (what ATen's CUDA kernels
call), ``1/(exp(beta)+1e-9)`` is an IEEE division, and the sine is the hardware's ``sin.approx.f32`` after a
two-constant range reduction (`rewrite.ops.triton_math.sin_fast`, absolute error about 2**-20.9): libdevice's
``sinf`` made the kernel 21-27% slower (H200, AuK shapes, e.g. C = 192, T = 19200: 26.1 against 20.2 us) for
a difference of 1.6e-7 x max|y| between the two (the numbers below were measured with ``sinf``). Measured fp32 on an H200
(torch 2.11, Triton 3.6), 240 random cases (log-scale alpha, beta ~ N(0, 0.5), x ~ 2 N(0, 1), T from 1
to 20000): Triton vs eager max-abs <= 2.8 eps32 * max|y|, relative L2 <= 3.1e-7, and both are within
7 eps32 * max|y| of an fp64 evaluation (the fused path is as accurate as eager). On the full-size AuK
shapes: SNR 144.8 dB, max-abs 1.4e-6 (``tools/bench_activation.py``). The CPU tests bound fp32 at
16 eps32 * max|y| and relative L2 1e-6 (``tests/test_alias_free_op.py`` says why). fp16/bf16: fp32
math on the rounded inputs, one rounding at the end (more accurate than the eager half-precision
module, which rounds after every op).

Cost (H200, fp32, GPU time as a CUDA-graph replay sees it): 9-20 us per activation against 107-276 us
for the eager module; 1.9 ms against 25.4 ms for the 109 activations of a 5 s clip. Called eagerly, the
op's Python dispatch and Triton's launch cost tens of microseconds of host time per call.

Dispatch (``torch.ops.rewrite.alias_free_snake``): the Triton kernel runs only when
`triton_unsupported_reason` returns None and the process-wide switch of `rewrite.ops.dispatch`
(``use_backend``/``set_backend``, re-exported here) is not ``"reference"``: Triton importable, ``x`` a
CUDA tensor (or a CPU tensor while the Triton interpreter is on, ``TRITON_INTERPRET=1`` set before
import, and the backend is forced to ``"triton"``: an ``"auto"`` CPU call never takes the slow
interpreter), fp32/fp16/bf16, a ``[B, C, T]`` (copied first unless its rows are contiguous runs), no autograd needed (``not
torch.is_grad_enabled()`` or no input requires grad) and no ``torch.compile`` tracing under way.
Otherwise the reference runs. When autograd is needed, the op's Autograd kernel runs the reference
aten ops directly (recorded by autograd), so the result is differentiable; this is also why the op is
defined with `torch.library.Library` and not `torch.library.custom_op`, whose implementations always
run with grad mode off and could not see that a gradient is wanted.

Second op, ``rewrite::alias_free_snake_causal_conv1d(x, alpha, beta, taps, logscale, weight, bias,
dilation, residual, x_bias=None)``: the activation feeding a causal conv (``causal_conv1d(alias_free_snake(x
+ x_bias), ...)``, every conv of the AuK decoder; ``x_bias`` is the bias of the conv that produced x,
deferred to here by the ``deferred_conv_bias`` pattern). With the Triton kernel it allocates
``[B, C, left + T]`` and the kernel writes the ``left = dilation * (k - 1)`` zeros and then its output
(``run_triton_kernel(..., left_zeros=left, x_bias=x_bias)``; the kernel adds ``x_bias`` as it reads x,
rounded to x's dtype as ATen's ``add_`` rounds), then runs the same ``conv1d`` on it; with a residual, the
conv runs without its bias and one kernel adds bias and residual with ATen's two roundings (ATen's CUDA conv
adds its bias with a separate ``add_``). So the result is bit-identical to the separate ops, without the
pad's fill and copy, the deferred bias pass and the residual add pass. Without the kernel it runs the
separate reference ops.

Where `rewrite.ops.triton_conv1d.chosen` picks it (16+ output channels, not one of the convs where cuDNN
measured faster), the conv is not ATen's: the activation kernel writes ``[B, left + T, C]`` (channels-last)
rounded to TF32 (fp32 with TF32 allowed) and the Triton implicit-GEMM conv reads it, with the weights
repacked ``[O, K, C]`` (and TF32-rounded) per call, or taken from the runner's
`rewrite.ops.triton_conv1d.PackedWeightCache` when one is active, adding bias and residual in its epilogue
(``tolerance``: TF32 products as cuDNN's, another summation order; see that module). The switch
``TRITON_CONV`` (module attribute) turns this off for probes and tests.

The kernel reads any x whose ``B * C`` rows are contiguous runs at one stride (`rows_stride`: a contiguous
x, or a view cropping each row such as the causal transposed conv's output) in place; other layouts are
copied first.

Ops know nothing of graphs, patterns or the API.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from rewrite.ops import dispatch, triton_conv1d, triton_launch, valid_length
from rewrite.ops.alias_free_geometry import DOWN_PAD, FILTER_TAPS, RESAMPLE_RATIO, SNAKE_EPS, UP_CROP, UP_PAD
from rewrite.ops.dispatch import INTERPRETING, get_backend, set_backend, use_backend

try:  # Triton is optional: without it every call takes the reference path.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with the Linux torch wheels
    triton = None

__all__ = [
    "INTERPRETING",
    "SUPPORTED_DTYPES",
    "alias_free_snake",
    "alias_free_snake_causal_conv1d_reference",
    "alias_free_snake_reference",
    "choose_implementation",
    "get_backend",
    "run_triton_kernel",
    "set_backend",
    "triton_unsupported_reason",
    "use_backend",
]

# ---------------------------------------------------------------------------------------------------
# Geometry (fixed by the AuK decoder)
# ---------------------------------------------------------------------------------------------------

HALO = 8  # positions a Triton tile recomputes on its left (the low-pass reaches back 6: 8 keeps alignment)

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The fused op's conv: the channels-last Triton conv where `triton_conv1d.chosen` says so, else ATen's (a
# module switch for probes and tests).
TRITON_CONV = True


# ---------------------------------------------------------------------------------------------------
# Reference: the eager module's aten sequence
# ---------------------------------------------------------------------------------------------------


def alias_free_snake_reference(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool = True) -> Tensor:
    """The eager `AliasFreeSnakeBeta` computation, call for call (``torch.equal`` to the module)."""
    channels = x.shape[1]
    filt = taps.view(1, 1, FILTER_TAPS).expand(channels, -1, -1)
    padded = F.pad(x, (UP_PAD, UP_PAD), mode="replicate")
    u = RESAMPLE_RATIO * F.conv_transpose1d(padded, filt, stride=RESAMPLE_RATIO, groups=channels)
    u = u[..., UP_CROP:-UP_CROP]
    a, b = alpha.view(1, -1, 1), beta.view(1, -1, 1)
    if logscale:
        a, b = a.exp(), b.exp()
    v = u + 1.0 / (b + SNAKE_EPS) * torch.sin(u * a).pow(2)
    return F.conv1d(F.pad(v, (DOWN_PAD, 0), mode="replicate"), filt, stride=RESAMPLE_RATIO, groups=channels)


def _validate(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor) -> None:
    """Shape/dtype/device preconditions shared by every implementation (ValueError otherwise)."""
    if x.dim() != 3 or x.shape[-1] < 1:
        raise ValueError(f"alias_free_snake: x must be [B, C, T] with T >= 1, got shape {tuple(x.shape)}")
    channels = x.shape[1]
    for name, t in (("alpha", alpha), ("beta", beta)):
        if t.numel() != channels:
            raise ValueError(f"alias_free_snake: {name} must hold C={channels} values, got shape {tuple(t.shape)}")
    if taps.numel() != FILTER_TAPS:
        raise ValueError(f"alias_free_snake: taps must hold {FILTER_TAPS} values, got shape {tuple(taps.shape)}")
    for name, t in (("alpha", alpha), ("beta", beta), ("taps", taps)):
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(
                f"alias_free_snake: {name} is {t.dtype} on {t.device}, x is {x.dtype} on {x.device} (must match)"
            )


# ---------------------------------------------------------------------------------------------------
# Dispatch (the process-wide switch of `rewrite.ops.dispatch`, shared with the other kernels)
# ---------------------------------------------------------------------------------------------------


def _autograd_needed(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def triton_unsupported_reason(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor) -> Optional[str]:
    """None when the Triton kernel may serve this call, else why not.

    `rewrite.ops.dispatch.kernel_unsupported_reason` (CUDA, or CPU under the interpreter with the
    backend forced to "triton"; fp32/fp16/bf16; no autograd; not compiling). Any layout of ``x``: the
    kernel reads a row-cropping view (such as the transposed conv's cropped output) in place and copies other
    layouts first.
    """
    return dispatch.kernel_unsupported_reason("alias_free_snake", (x, alpha, beta, taps), SUPPORTED_DTYPES)


def choose_implementation(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor) -> tuple[str, Optional[str]]:
    """``("triton", None)`` or ``("reference", reason)``: what the op runs for these inputs now.

    Raises ValueError when the backend is forced to "triton" and the kernel cannot serve the call.
    """
    return dispatch.choose("alias_free_snake", lambda: triton_unsupported_reason(x, alpha, beta, taps))


# ---------------------------------------------------------------------------------------------------
# The op
# ---------------------------------------------------------------------------------------------------

_LIB = torch.library.Library("rewrite", "FRAGMENT")
_LIB.define("alias_free_snake(Tensor x, Tensor alpha, Tensor beta, Tensor taps, bool logscale=True) -> Tensor")


def _dispatch_impl(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool = True) -> Tensor:
    """Backend kernel (every device): Triton when `choose_implementation` allows it, else the reference."""
    _validate(x, alpha, beta, taps)
    implementation, _ = choose_implementation(x, alpha, beta, taps)
    if implementation == "triton":
        return run_triton_kernel(x, alpha, beta, taps, logscale)
    return alias_free_snake_reference(x, alpha, beta, taps, logscale)


def _autograd_impl(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool = True) -> Tensor:
    """Autograd kernel: the reference's aten ops (recorded by autograd) when a gradient is needed, else
    the backend kernel below autograd."""
    if _autograd_needed(x, alpha, beta, taps):
        _validate(x, alpha, beta, taps)
        return alias_free_snake_reference(x, alpha, beta, taps, logscale)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.rewrite.alias_free_snake.default(x, alpha, beta, taps, logscale)


_LIB.impl("alias_free_snake", _dispatch_impl, "CompositeExplicitAutograd")
_LIB.impl("alias_free_snake", _autograd_impl, "Autograd")


@torch.library.register_fake("rewrite::alias_free_snake")
def _alias_free_snake_fake(x, alpha, beta, taps, logscale=True):
    _validate(x, alpha, beta, taps)
    return x.new_empty(x.shape)


def alias_free_snake(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool = True) -> Tensor:
    """Alias-free SnakeBeta of the AuK decoder: ``[B, C, T] -> [B, C, T]`` (see the module docstring).

    ``alpha``/``beta``: the module's per-channel parameters as stored (log-scale when ``logscale``);
    ``taps``: its 12-tap filter buffer; all in ``x``'s dtype and device. Runs the Triton kernel when
    `choose_implementation` says so (exactness class ``tolerance``), else the reference (``torch.equal``
    to the eager module).
    """
    return torch.ops.rewrite.alias_free_snake.default(x, alpha, beta, taps, logscale)


# ---------------------------------------------------------------------------------------------------
# The activation feeding a causal conv: the conv's zero pad written by the activation kernel
# ---------------------------------------------------------------------------------------------------

_LIB.define("alias_free_snake_causal_conv1d(Tensor x, Tensor alpha, Tensor beta, Tensor taps, bool logscale, "
            "Tensor weight, Tensor? bias, int[] dilation, Tensor? residual, Tensor? x_bias=None) -> Tensor")


def alias_free_snake_causal_conv1d_reference(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool,
                                             weight: Tensor, bias: Optional[Tensor], dilation: list[int],
                                             residual: Optional[Tensor], x_bias: Optional[Tensor] = None) -> Tensor:
    """``causal_conv1d(alias_free_snake(x + x_bias), ...)``: the ops this one fuses, each as its own op runs
    (``x_bias``: the bias of the conv that produced x, deferred to here; None for none)."""
    from rewrite.ops.auk import causal_conv1d_reference

    if x_bias is not None:
        x = torch.ops.aten.add.Tensor(x, x_bias.view(1, -1, 1))
    activation = torch.ops.rewrite.alias_free_snake.default(x, alpha, beta, taps, logscale)
    return causal_conv1d_reference(activation, weight, bias, dilation, residual)


def _snake_conv_impl(x, alpha, beta, taps, logscale, weight, bias, dilation, residual, x_bias=None):
    """Triton activation (adding ``x_bias`` as it reads x) writing ``[B, C, left + T]`` with the zero pad in
    place, the same conv1d as `causal_conv1d_reference` on that tensor, and with a residual, the conv's
    bias and the residual added by one kernel with ATen's two roundings: equal, bit for bit, to the
    separate ops (ATen's CUDA conv adds its bias with a separate ``add_``). Where `triton_conv1d.chosen`
    says so, the activation is written channels-last and TF32-rounded and the Triton conv runs instead."""
    _validate(x, alpha, beta, taps)
    if choose_implementation(x, alpha, beta, taps)[0] != "triton":
        return alias_free_snake_causal_conv1d_reference(x, alpha, beta, taps, logscale, weight, bias, dilation,
                                                        residual, x_bias)
    left = dilation[0] * (weight.shape[-1] - 1)
    if TRITON_CONV and triton_conv1d.chosen(weight, x.dtype, dilation[0]):
        padded = run_triton_kernel(x, alpha, beta, taps, logscale, left_zeros=left, x_bias=x_bias,
                                   channels_last_out=True, round_tf32=triton_conv1d.rounds_to_tf32(x.dtype))
        return triton_conv1d.causal_conv1d(padded, triton_conv1d.packed_weight(weight), bias, dilation[0], residual)
    padded = run_triton_kernel(x, alpha, beta, taps, logscale, left_zeros=left, x_bias=x_bias)
    if residual is None:
        return torch.ops.aten.conv1d.default(padded, weight, bias, [1], [0], dilation, 1)
    from rewrite.ops import triton_epilogue

    y = torch.ops.aten.conv1d.default(padded, weight, None, [1], [0], dilation, 1)
    as5d = lambda t: t[:, :, None, None, :]  # noqa: E731  [B, C, T] as [B, C, 1, 1, T]: one plane per row
    return triton_epilogue.bias_residual(as5d(y), bias, as5d(residual))[:, :, 0, 0, :]


def _snake_conv_autograd(x, alpha, beta, taps, logscale, weight, bias, dilation, residual, x_bias=None):
    tensors = (x, alpha, beta, taps, weight, *(t for t in (bias, residual, x_bias) if t is not None))
    if _autograd_needed(*tensors):
        return alias_free_snake_causal_conv1d_reference(x, alpha, beta, taps, logscale, weight, bias, dilation,
                                                        residual, x_bias)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.rewrite.alias_free_snake_causal_conv1d.default(
            x, alpha, beta, taps, logscale, weight, bias, dilation, residual, x_bias)


_LIB.impl("alias_free_snake_causal_conv1d", _snake_conv_impl, "CompositeExplicitAutograd")
_LIB.impl("alias_free_snake_causal_conv1d", _snake_conv_autograd, "Autograd")


@torch.library.register_fake("rewrite::alias_free_snake_causal_conv1d")
def _snake_conv_fake(x, alpha, beta, taps, logscale, weight, bias, dilation, residual, x_bias=None):
    _validate(x, alpha, beta, taps)
    return x.new_empty((x.shape[0], weight.shape[0], x.shape[2]))


# ---------------------------------------------------------------------------------------------------
# Triton kernel
# ---------------------------------------------------------------------------------------------------


if triton is not None:
    # libdevice's expf (what ATen's CUDA kernels call) and the hardware sine after a range reduction
    # (triton_math.sin_fast); numpy's under the interpreter
    from rewrite.ops.triton_math import exp as _exp
    from rewrite.ops.triton_math import round_tf32, round_to
    from rewrite.ops.triton_math import sin_fast as _sin

    @triton.jit
    def _snake_params(alpha_ptr, beta_ptr, channel, row_mask, LOGSCALE: tl.constexpr):
        """Per-row ``exp(alpha)`` and ``1 / (exp(beta) + 1e-9)`` in fp32, shaped ``[BLOCK_R, 1]``."""
        a = tl.load(alpha_ptr + channel, mask=row_mask, other=0.0).to(tl.float32)
        b = tl.load(beta_ptr + channel, mask=row_mask, other=0.0).to(tl.float32)
        if LOGSCALE:
            a = _exp(a)
            b = _exp(b)
        inv_b = tl.math.div_rn(tl.full(b.shape, 1.0, tl.float32), b + 1e-9)
        return a[:, None], inv_b[:, None]

    @triton.jit
    def _snake(u, a, inv_b):
        """SnakeBeta ``u + inv_b * sin(u * a)**2`` (fp32)."""
        s = _sin(u * a)
        return u + inv_b * (s * s)

    @triton.jit
    def _load_input(x_row, idx, row_mask, x_bias, HAS_X_BIAS: tl.constexpr):
        """``x[clamp(idx)]`` in fp32, plus ``x_bias`` (``[BLOCK_R, 1]`` fp32), the deferred per-channel bias of
        the conv that produced x, when ``HAS_X_BIAS`` (rounded to x's dtype, as ATen's ``add_`` of that bias
        would have stored it)."""
        raw = tl.load(x_row + idx[None, :], mask=row_mask[:, None], other=0.0)
        xv = raw.to(tl.float32)
        if HAS_X_BIAS:
            xv = round_to(xv + x_bias, raw.dtype).to(tl.float32)
        return xv

    @triton.jit
    def _upsample_pair(x_row, p, T, row_mask, taps_ptr, x_bias, HAS_X_BIAS: tl.constexpr):
        """``(u(2p), u(2p-1))`` of the x2 upsampler: both read ``x[clamp(p + 2 - q)]``, q = 0..5.

        ``x_row``: ``[BLOCK_R, 1]`` row pointers; ``p``: ``[N]`` positions; result ``[BLOCK_R, N]`` fp32.
        The clamp into ``[0, T-1]`` is the replicate padding (it never reaches further than its 5 samples).
        """
        xv = _load_input(x_row, tl.minimum(tl.maximum(p + 2, 0), T - 1), row_mask, x_bias, HAS_X_BIAS)
        even = tl.load(taps_ptr + 1).to(tl.float32) * xv
        odd = tl.load(taps_ptr).to(tl.float32) * xv
        for q in tl.static_range(1, 6):
            xv = _load_input(x_row, tl.minimum(tl.maximum(p + (2 - q), 0), T - 1), row_mask, x_bias, HAS_X_BIAS)
            even += tl.load(taps_ptr + (2 * q + 1)).to(tl.float32) * xv
            odd += tl.load(taps_ptr + 2 * q).to(tl.float32) * xv
        return 2.0 * even, 2.0 * odd

    @triton.jit
    def _oversampled_snake(x_row, p, T, row_mask, taps_ptr, a, inv_b, v0, x_bias, HAS_X_BIAS: tl.constexpr):
        """``(v(2p), v(2p-1))``: SnakeBeta of the upsampled pair, with ``v(j<0) = v(0)`` (causal pad)."""
        up_even, up_odd = _upsample_pair(x_row, p, T, row_mask, taps_ptr, x_bias, HAS_X_BIAS)
        v_even = tl.where(p[None, :] < 0, v0, _snake(up_even, a, inv_b))
        v_odd = tl.where(p[None, :] <= 0, v0, _snake(up_odd, a, inv_b))
        return v_even, v_odd

    # The limit arguments (14, 15: see `rewrite.ops.valid_length`) are not specialized: one variant for every
    # layer's scale.
    @triton.jit(do_not_specialize=[14, 15])
    def _alias_free_snake_kernel(
        x_ptr, x_bias_ptr, alpha_ptr, beta_ptr, taps_ptr, out_ptr, rows, channels, T, t_blocks, x_row_stride,
        out_row_stride, out_offset, limit_ptr, limit_scale, limit_extra,
        LOGSCALE: tl.constexpr, HAS_X_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
        HALO_T: tl.constexpr, ZEROS_BLOCK: tl.constexpr, OUT_CHANNELS_LAST: tl.constexpr = False,
        ROUND_TF32: tl.constexpr = False,
    ):
        """One ``[BLOCK_R, BLOCK_T - HALO_T]`` output tile: positions ``base + i`` with ``i >= HALO_T``.

        Input row ``r`` (of ``B * C``) starts at ``r * x_row_stride``: a contiguous x, or a view that crops
        each row (the causal transposed conv's output). Output row ``r`` starts at ``r * out_row_stride``
        and holds ``out_offset`` zeros (a causal conv's zero pad; the programs of time block 0 write them,
        ``ZEROS_BLOCK`` >= out_offset, 0 for none) then the ``T`` outputs. With ``OUT_CHANNELS_LAST`` the
        output is ``[B, out_offset + T, C]`` instead (position-major, what the Triton conv reads;
        ``out_row_stride`` unused) and the launcher guarantees ``channels % BLOCK_R == 0``, so a row block
        is ``BLOCK_R`` adjacent channels of one batch row: contiguous along the block for the stores.
        ``ROUND_TF32`` (fp32 only) stores the outputs rounded to TF32 (for a TF32 conv that reads them).

        A 1-D grid (no 65535 limit on any axis): program ``pid`` is row block ``pid // t_blocks``, time
        block ``pid % t_blocks`` (neighbouring programs share input rows). With ``limit_scale > 0`` a time
        block whose first output lies at or past ``limit_ptr[0] * limit_scale + limit_extra`` returns at once
        (`rewrite.ops.valid_length`; block 0, which writes the zeros, never does).
        """
        pid = tl.program_id(0)
        if limit_scale > 0:
            if (pid % t_blocks) * (BLOCK_T - HALO_T) >= tl.load(limit_ptr) * limit_scale + limit_extra:
                return
        r = (pid // t_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
        row_mask = r < rows
        channel = r % channels
        a, inv_b = _snake_params(alpha_ptr, beta_ptr, channel, row_mask, LOGSCALE)
        x_bias = tl.zeros([BLOCK_R, 1], tl.float32)
        if HAS_X_BIAS:
            x_bias = tl.load(x_bias_ptr + channel, mask=row_mask, other=0.0).to(tl.float32)[:, None]
        x_row = x_ptr + r.to(tl.int64)[:, None] * x_row_stride
        zero = tl.zeros([1], tl.int32)
        v0 = _snake(_upsample_pair(x_row, zero, T, row_mask, taps_ptr, x_bias, HAS_X_BIAS)[0], a, inv_b)

        i = tl.arange(0, BLOCK_T)
        t_block = pid % t_blocks
        p = t_block * (BLOCK_T - HALO_T) - HALO_T + i
        v_even, v_odd = _oversampled_snake(x_row, p, T, row_mask, taps_ptr, a, inv_b, v0, x_bias, HAS_X_BIAS)

        acc = tl.zeros([BLOCK_R, BLOCK_T], tl.float32)
        for q in tl.static_range(6):  # y[m] = sum_q h[2q+1] v(2(m+q-5)) + h[2q] v(2(m+q-5) - 1)
            shift = tl.broadcast_to(tl.maximum(i + (q - 5), 0)[None, :], (BLOCK_R, BLOCK_T))
            acc += tl.load(taps_ptr + (2 * q + 1)).to(tl.float32) * tl.gather(v_even, shift, 1)
            acc += tl.load(taps_ptr + 2 * q).to(tl.float32) * tl.gather(v_odd, shift, 1)

        mask = row_mask[:, None] & ((i >= HALO_T) & (p < T))[None, :]
        if ROUND_TF32:
            acc = round_tf32(acc)
        if OUT_CHANNELS_LAST:
            row0 = (pid // t_blocks) * BLOCK_R
            batch = row0 // channels
            out_row = (out_ptr + batch.to(tl.int64) * (out_offset + T) * channels
                       + (row0 - batch * channels + tl.arange(0, BLOCK_R))[:, None])
            position_stride = channels
        else:
            out_row = out_ptr + r.to(tl.int64)[:, None] * out_row_stride
            position_stride = 1
        positions = (out_offset + p).to(tl.int64)  # times C when channels-last: past 2**31 on long clips
        tl.store(out_row + positions[None, :] * position_stride, acc.to(out_ptr.dtype.element_ty), mask=mask)
        if ZEROS_BLOCK > 0:
            if t_block == 0:
                j = tl.arange(0, ZEROS_BLOCK)
                zeros = tl.zeros([BLOCK_R, ZEROS_BLOCK], out_ptr.dtype.element_ty)
                tl.store(out_row + j[None, :] * position_stride, zeros,
                         mask=row_mask[:, None] & (j < out_offset)[None, :])


# Launch geometry, measured on an H200 (fp32, the AuK shapes): one warp per program and tiles of at most
# 256 positions keep every tl.gather inside one warp (shuffles, no shared-memory round trip). That ran
# 1.6x faster than 4 warps on 1024-position tiles, and faster than 2 or 4 warps on 64-256 positions.
TILE_ELEMENTS = 256  # positions (outputs plus halo) x rows per program
BLOCK_T_CHOICES = (16, 32, 64, 128, 256)
TILE_OVERHEAD = 64  # per-tile cost, in positions, when choosing BLOCK_T
NUM_WARPS = 1
# The zero margin block: one size for every AuK pad (at most 5 * (11 - 1) = 50), so the pads do not each
# compile a kernel variant of their own (the price: masked lanes in the zero stores of time block 0 only).
MIN_ZEROS_BLOCK = 64


def _launch_config(rows: int, length: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_T, num_warps): the least padded work (a tile costs its size plus an overhead),
    ties to the larger tile; rows fill the tile up to `TILE_ELEMENTS`."""

    def cost(block_t: int) -> tuple[int, int]:
        tiles = triton.cdiv(length, block_t - HALO)
        return tiles * (block_t + TILE_OVERHEAD), -block_t

    block_t = min(BLOCK_T_CHOICES, key=cost)
    block_r = min(triton.next_power_of_2(rows), max(1, TILE_ELEMENTS // block_t))
    return block_r, block_t, NUM_WARPS


# Channels-last output (the Triton conv's input): a row block must be adjacent channels of one batch row.
# Measured on an H200 (fp32, 320-frame AuK shapes): 8 channels x 128 positions on 4 warps for C >= 48 (13-32
# us per activation against 15-40 us for the one-warp tiles), 4 x 64 on one warp for C = 24 (31 against 54).
CHANNELS_LAST_WIDE = (8, 128, 4)
CHANNELS_LAST_NARROW = (4, 64, 1)


def _launch_config_channels_last(channels: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_T, num_warps) for a channels-last output; BLOCK_R always divides `channels`."""
    if channels >= 48 and channels % CHANNELS_LAST_WIDE[0] == 0:
        return CHANNELS_LAST_WIDE
    block_r = min(CHANNELS_LAST_NARROW[0], channels & -channels)
    return (block_r, *CHANNELS_LAST_NARROW[1:])


def rows_stride(x: Tensor) -> Optional[int]:
    """The one stride between the ``B * C`` rows of a ``[B, C, T]`` x whose rows are contiguous runs (a
    contiguous x, or a view cropping each row, such as the causal transposed conv's output), else None."""
    batch, channels, length = x.shape
    if length > 1 and x.stride(2) != 1:
        return None
    if batch > 1 and channels > 1 and x.stride(0) != channels * x.stride(1):
        return None
    return x.stride(1) if channels > 1 else x.stride(0) if batch > 1 else length


def run_triton_kernel(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool = True,
                      left_zeros: int = 0, x_bias: Optional[Tensor] = None, channels_last_out: bool = False,
                      round_tf32: bool = False, launch: Optional[tuple[int, int, int]] = None) -> Tensor:
    """Launch the fused kernel (no dispatch checks beyond the preconditions it relies on).

    ``x``: ``[B, C, T]`` fp32/fp16/bf16 on CUDA (or CPU under ``TRITON_INTERPRET=1``) whose rows are
    contiguous (`rows_stride`; other layouts are copied first); alpha, beta, taps as for
    `alias_free_snake`. ``x_bias`` (``[C]``, x's dtype): the bias of the conv that produced x, deferred
    to here: the kernel reads ``x + x_bias`` rounded to x's dtype, what ``x.add_(x_bias)`` would hold.
    Returns a new contiguous tensor of x's dtype, ``[B, C, left_zeros + T]`` with zeros in its first
    ``left_zeros`` columns (a causal conv's zero pad, written by the kernel so that no pad pass copies the
    activation again). With ``channels_last_out`` the result is ``[B, left_zeros + T, C]`` (contiguous,
    position-major: the input layout of `rewrite.ops.triton_conv1d`) with the zeros in its first
    ``left_zeros`` positions. ``round_tf32`` (fp32 only) stores the outputs rounded to the nearest TF32
    value, for a TF32 conv that reads them (its tensor cores would truncate them). ``launch`` overrides the
    (BLOCK_R, BLOCK_T, num_warps) choice (probes).
    """
    if triton is None:
        raise RuntimeError("alias_free_snake: triton is not importable")
    _validate(x, alpha, beta, taps)
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"alias_free_snake: the kernel needs a {SUPPORTED_DTYPES} x, got {x.dtype}")
    if x_bias is not None and (x_bias.numel() != x.shape[1] or x_bias.dtype != x.dtype or x_bias.device != x.device):
        raise ValueError(f"alias_free_snake: x_bias must hold C={x.shape[1]} values of x's dtype and device, "
                         f"got {tuple(x_bias.shape)} {x_bias.dtype} on {x_bias.device}")
    if round_tf32 and x.dtype != torch.float32:
        raise ValueError(f"alias_free_snake: round_tf32 needs an fp32 x, got {x.dtype}")
    row_stride = rows_stride(x)
    if row_stride is None:
        x = x.contiguous()
        row_stride = x.shape[2]
    batch, channels, length = x.shape
    shape = (batch, left_zeros + length, channels) if channels_last_out else (batch, channels, left_zeros + length)
    out = x.new_empty(shape)
    rows = batch * channels
    if rows == 0:
        return out
    if launch is not None:
        block_r, block_t, num_warps = launch
    elif channels_last_out:
        block_r, block_t, num_warps = _launch_config_channels_last(channels)
    else:
        block_r, block_t, num_warps = _launch_config(rows, length)
    if channels_last_out and channels % block_r:
        raise ValueError(f"alias_free_snake: a channels-last output needs BLOCK_R={block_r} to divide C={channels}")
    t_blocks = triton.cdiv(length, block_t - HALO)
    grid = (triton.cdiv(rows, block_r) * t_blocks,)
    triton_launch.launch(
        _alias_free_snake_kernel, grid,
        x, x if x_bias is None else x_bias.reshape(-1).contiguous(), alpha.reshape(-1).contiguous(),
        beta.reshape(-1).contiguous(), taps.reshape(-1).contiguous(), out,
        rows, channels, length, t_blocks, row_stride, left_zeros + length, left_zeros,
        *valid_length.kernel_args(length, x.device),
        LOGSCALE=logscale, HAS_X_BIAS=x_bias is not None, BLOCK_R=block_r, BLOCK_T=block_t, HALO_T=HALO,
        ZEROS_BLOCK=max(MIN_ZEROS_BLOCK, triton.next_power_of_2(left_zeros)) if left_zeros else 0,
        OUT_CHANNELS_LAST=channels_last_out,
        ROUND_TF32=round_tf32, num_warps=num_warps, exact=False,
    )
    return out
