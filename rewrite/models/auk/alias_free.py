"""AuK's alias-free SnakeBeta activation as custom ops: ``rewrite::alias_free_snake`` and
``rewrite::alias_free_snake_causal_conv1d``.

``alias_free_snake(x, alpha, beta, taps, logscale=True)`` computes ``AliasFreeSnakeBeta.forward`` of
`rewrite.models.auk.model` (docs/design.md) for ``x`` of shape ``[B, C, T]``, per-channel ``alpha``/``beta`` of
shape ``[C]`` and the 12 Kaiser-sinc ``taps``::

    u = 2 * conv_transpose1d(replicate_pad(x, 5, 5), taps, stride=2, groups=C)[..., 15:-15]   # [B, C, 2T]
    v = u + 1 / (exp(beta) + 1e-9) * sin(u * exp(alpha)) ** 2                                 # SnakeBeta
    y = conv1d(replicate_pad(v, 11, 0), taps, stride=2, groups=C)                             # [B, C, T]

(``exp`` only with ``logscale=True``, the AuK default.) The ratio 2, the 12 taps, the pads (5, 5) and
(11, 0) and the crop 15 are constants of the op (`rewrite.kernels.alias_free.geometry`, which the model reads
too). The up- and down-sampler share one filter (the module's ``taps`` buffer), so the op takes it once.

Implementations: the reference (`rewrite.models.auk.alias_free_reference`: the eager module's ATen calls,
``torch.equal`` to it on every device and dtype) and the one-pass Triton kernel
(`rewrite.kernels.alias_free.snake.run_triton_kernel`).

Exactness: ``tolerance`` (enabled at level ``channels_last``): the kernel sums the filters in its own order,
with FMA contraction and a fast sine, so it is not bit-identical to cuDNN's convs. Contract checked by the
CPU tests: fp32 within 16 eps32 * max|y| and relative L2 1e-6 of the eager module
(``tests/models/auk/test_alias_free.py`` says why); fp16/bf16: fp32 math on the rounded inputs, one rounding at the
end. Measured accuracy and cost on the GPU: docs/tuning.md section 5, "AuK alias-free activation".

Dispatch: the Triton kernel runs only when `triton_unsupported_reason` returns None and the backend of the
run context (`rewrite.ops.dispatch`: ``use_backend``/``set_backend``, re-exported here) is not
``"reference"``: Triton importable, ``x`` a CUDA tensor (or a CPU tensor while the Triton interpreter is on,
``TRITON_INTERPRET=1`` set before import, and the backend is forced to ``"triton"``: an ``"auto"`` CPU call
never takes the slow interpreter), fp32/fp16/bf16, a ``[B, C, T]`` (copied first unless its rows are
contiguous runs), no autograd needed (``not torch.is_grad_enabled()`` or no input requires grad) and no
``torch.compile`` tracing under way. Otherwise the reference runs. Both ops are `torch.library.custom_op`s,
registered as every op of the library is; their gradient (`register_autograd`) is the reference's, recomputed
from the saved inputs, so it is the eager module's bit for bit whichever implementation ran forward, and
`alias_free_snake` itself runs the reference directly when a gradient is wanted.

``alias_free_snake_causal_conv1d(x, alpha, beta, taps, logscale, weight, bias, dilation, residual,
x_bias=None)`` is the activation feeding a causal conv (``causal_conv1d(alias_free_snake(x + x_bias), ...)``,
every conv of the AuK decoder; ``x_bias`` is the bias of the conv that produced x, deferred to here by the
``deferred_conv_bias`` pattern). With the Triton kernel it allocates ``[B, C, left + T]`` and the kernel
writes the ``left = dilation * (k - 1)`` zeros and then its output (adding ``x_bias`` as it reads x, rounded
to x's dtype as ATen's ``add_`` rounds), then runs the same ``conv1d`` on it; with a residual, the conv runs
without its bias and one kernel adds bias and residual with ATen's two roundings
(`rewrite.kernels.epilogue.epilogue.bias_residual`; ATen's CUDA conv adds its bias with a separate ``add_``). So
the result is bit-identical to the separate ops, without the pad's fill and copy, the deferred bias pass and
the residual add pass. (On the CPU, where only the tests run the kernel, the conv keeps its bias and ATen
adds the residual: a CPU conv may fold its bias into the sum, `dispatch.conv_bias_is_separate`.) Without the
kernel it runs the separate reference ops.

Where `rewrite.kernels.conv1d.conv1d.chosen` picks it (16+ output channels, not one of the convs where cuDNN
measured faster), the conv is not ATen's: the activation kernel writes ``[B, left + T, C]`` (channels-last)
rounded to TF32 (fp32 with TF32 allowed) and the Triton implicit-GEMM conv reads it, with the weights
repacked ``[O, K, C]`` (and TF32-rounded) per call, or taken from the run context's
`rewrite.kernels.conv1d.conv1d.PackedWeightCache` when one is set, adding bias and residual in its epilogue
(``tolerance``: TF32 products as cuDNN's, another summation order; see that module). The run context's
``triton_conv1d`` setting (``rewrite.ops.run_context.using(triton_conv1d=False)``) turns this off for probes
and tests.

Ops know nothing of graphs, patterns or the API.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.ops import dispatch, run_context
from rewrite.kernels.conv1d import conv1d as triton_conv1d
from rewrite.kernels.epilogue import epilogue as triton_epilogue
from rewrite.models.auk.alias_free_reference import (alias_free_snake_causal_conv1d_reference, alias_free_snake_reference,
                                              validate)
from rewrite.ops.dispatch import INTERPRETING, get_backend, set_backend, use_backend
from rewrite.kernels.alias_free.snake import SUPPORTED_DTYPES, rows_stride, run_triton_kernel

__all__ = [
    "INTERPRETING",
    "SUPPORTED_DTYPES",
    "SnakeConvStage",
    "alias_free_snake",
    "alias_free_snake_causal_conv1d_reference",
    "alias_free_snake_reference",
    "choose_implementation",
    "get_backend",
    "rows_stride",
    "run_triton_kernel",
    "set_backend",
    "triton_unsupported_reason",
    "use_backend",
]


# ---- dispatch ---------------------------------------------------------------------------------------------
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


# ---- gradients: the reference's, recomputed -------------------------------------------------------------
def _reference_gradients(ctx, reference, inputs: tuple, grad: Tensor) -> tuple:
    """The gradients of ``reference(*inputs)`` against ``grad``, for the inputs ``ctx.needs_input_grad`` names
    (None for the others): the reference's aten ops run again under autograd, so the gradient is the eager
    module's, bit for bit, whichever implementation computed the forward value."""
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(need) if isinstance(t, Tensor) and need else t
                  for t, need in zip(inputs, ctx.needs_input_grad)]
        wanted = [t for t, need in zip(leaves, ctx.needs_input_grad) if isinstance(t, Tensor) and need]
        found = iter(torch.autograd.grad(reference(*leaves), wanted, grad, allow_unused=True))
    return tuple(next(found) if isinstance(t, Tensor) and need else None
                 for t, need in zip(inputs, ctx.needs_input_grad))


def _save_inputs(ctx, inputs: tuple, output: Tensor) -> None:
    tensors = [i for i, t in enumerate(inputs) if isinstance(t, Tensor)]
    ctx.save_for_backward(*(inputs[i] for i in tensors))
    ctx.tensor_slots, ctx.others = tensors, inputs


def _saved_inputs(ctx) -> tuple:
    inputs = list(ctx.others)
    for i, t in zip(ctx.tensor_slots, ctx.saved_tensors):
        inputs[i] = t
    return tuple(inputs)


# ---- the activation ----------------------------------------------------------------------------------
@torch.library.custom_op("rewrite::alias_free_snake", mutates_args=())
def _alias_free_snake_op(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool = True) -> Tensor:
    """Every device: Triton when `choose_implementation` allows it, else the reference."""
    validate(x, alpha, beta, taps)
    implementation, _ = choose_implementation(x, alpha, beta, taps)
    if implementation == "triton":
        return run_triton_kernel(x, alpha, beta, taps, logscale)
    return alias_free_snake_reference(x, alpha, beta, taps, logscale)


@_alias_free_snake_op.register_fake
def _alias_free_snake_fake(x, alpha, beta, taps, logscale=True):
    validate(x, alpha, beta, taps)
    return x.new_empty(x.shape)


_alias_free_snake_op.register_autograd(
    lambda ctx, grad: _reference_gradients(ctx, alias_free_snake_reference, _saved_inputs(ctx), grad),
    setup_context=_save_inputs)


def alias_free_snake(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool = True) -> Tensor:
    """Alias-free SnakeBeta of the AuK decoder: ``[B, C, T] -> [B, C, T]`` (see the module docstring).

    ``alpha``/``beta``: the module's per-channel parameters as stored (log-scale when ``logscale``);
    ``taps``: its 12-tap filter buffer; all in ``x``'s dtype and device. Runs the Triton kernel when
    `choose_implementation` says so (exactness class ``tolerance``), else the reference (``torch.equal``
    to the eager module). When a gradient is wanted, the reference's aten ops run directly (recorded by
    autograd).
    """
    if _autograd_needed(x, alpha, beta, taps):
        validate(x, alpha, beta, taps)
        return alias_free_snake_reference(x, alpha, beta, taps, logscale)
    return torch.ops.rewrite.alias_free_snake.default(x, alpha, beta, taps, logscale)


# ---- the activation feeding a causal conv: the conv's zero pad written by the activation kernel -----------
class SnakeConvStage(NamedTuple):
    """One activation + causal conv of the AuK decoder as `alias_free_snake_causal_conv1d` takes it (log-scale
    parameters): the activation's parameters and filter, then the conv's. The patterns name their arguments
    with it (`rewrite.engine.pattern`: one placeholder per field)."""

    alpha: Tensor
    beta: Tensor
    taps: Tensor
    weight: Tensor
    bias: Optional[Tensor]
    dilation: list[int]


@torch.library.custom_op("rewrite::alias_free_snake_causal_conv1d", mutates_args=())
def _snake_conv_op(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool, weight: Tensor,
                   bias: Optional[Tensor], dilation: list[int], residual: Optional[Tensor],
                   x_bias: Optional[Tensor] = None) -> Tensor:
    """Triton activation (adding ``x_bias`` as it reads x) writing ``[B, C, left + T]`` with the zero pad in
    place, the same conv1d as `causal_conv1d_reference` on that tensor, and with a residual on CUDA, the
    conv's bias and the residual added by one kernel with ATen's two roundings (ATen's CUDA conv adds its
    bias with a separate ``add_``); elsewhere (the CPU under the interpreter, where a conv may fold its bias
    into the sum) the reference's own conv and add. Equal, bit for bit, to the separate ops on every device.
    Where `triton_conv1d.chosen` says so, the activation is written channels-last and TF32-rounded and the
    Triton conv runs instead."""
    validate(x, alpha, beta, taps)
    if choose_implementation(x, alpha, beta, taps)[0] != "triton":
        return alias_free_snake_causal_conv1d_reference(x, alpha, beta, taps, logscale, weight, bias, dilation,
                                                        residual, x_bias)
    left = dilation[0] * (weight.shape[-1] - 1)
    if run_context.current().triton_conv1d and triton_conv1d.chosen(weight, x.dtype, dilation[0]):
        padded = run_triton_kernel(x, alpha, beta, taps, logscale, left_zeros=left, x_bias=x_bias,
                                   channels_last_out=True, round_tf32=triton_conv1d.rounds_to_tf32(x.dtype))
        return triton_conv1d.causal_conv1d(padded, triton_conv1d.packed_weight(weight), bias, dilation[0], residual)
    padded = run_triton_kernel(x, alpha, beta, taps, logscale, left_zeros=left, x_bias=x_bias)
    if residual is None or not dispatch.conv_bias_is_separate(x.device):  # the reference's conv and add
        y = torch.ops.aten.conv1d.default(padded, weight, bias, [1], [0], dilation, 1)
        return y if residual is None else torch.ops.aten.add.Tensor(residual, y)
    y = torch.ops.aten.conv1d.default(padded, weight, None, [1], [0], dilation, 1)
    as5d = lambda t: t[:, :, None, None, :]  # noqa: E731  [B, C, T] as [B, C, 1, 1, T]: one plane per row
    return triton_epilogue.bias_residual(as5d(y), bias, as5d(residual))[:, :, 0, 0, :]


@_snake_conv_op.register_fake
def _snake_conv_fake(x, alpha, beta, taps, logscale, weight, bias, dilation, residual, x_bias=None):
    validate(x, alpha, beta, taps)
    return x.new_empty((x.shape[0], weight.shape[0], x.shape[2]))


_snake_conv_op.register_autograd(
    lambda ctx, grad: _reference_gradients(ctx, alias_free_snake_causal_conv1d_reference, _saved_inputs(ctx), grad),
    setup_context=_save_inputs)
