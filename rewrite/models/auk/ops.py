"""Custom ops for the AuK decoder's fusion families, in the `rewrite` torch.library namespace.

Every op here has a *reference implementation*: the ATen calls, in the order and with the arguments, that
the eager `rewrite.models.auk.model` modules make (and that the captured subgraph it replaces holds), so a
rewritten graph is ``torch.equal`` to the captured one on any device and dtype. Each op has a fake
implementation for export/compile tracing. Faster kernels plug in behind these signatures and keep them
bit-identical (the *tolerance* alias-free kernel is a separate op, ``rewrite::alias_free_snake`` in
`rewrite.models.auk.alias_free`).

``alias_free_snake_exact`` (exactness: exact, level ``lossless``) has such a kernel path
(`rewrite.kernels.alias_free.exact`): Triton replicate pad -> ATen ``conv_transpose1d`` (the reference's call) ->
one Triton kernel for ``* 2``, the crop, SnakeBeta and the (11, 0) replicate pad, rounding to the
activation dtype after every ATen op it replaces -> ATen ``conv1d`` (the reference's call). The per-channel
``exp(alpha)`` and ``1 / (exp(beta) + 1e-9)`` are computed with the reference's ATen calls. It runs when
`exact_kernel_unsupported_reason` returns None and the `rewrite.ops.dispatch` switch is not "reference":
CUDA tensors (or CPU under ``TRITON_INTERPRET=1`` with the backend forced to "triton"), fp32/fp16/bf16, a
``[B, C, T]`` x (any strides: a non-contiguous x is copied first) with ``T >= 1`` and ``B * C >= 1``, alpha/beta of ``C`` values and 12 taps, all
of x's dtype, no autograd, not compiling; otherwise the reference runs. (A `custom_op` body runs with grad
mode off, so inside the op the autograd condition never fires; the op registers no backward either way.)

Ops:
  alias_free_snake_module(x, alpha, beta, taps, logscale)  one `AliasFreeSnakeBeta` call as the capture records
                                                           it (`rewrite.models.auk.capture`): always the module's ATen calls
  alias_free_snake_exact(x, alpha, beta, taps, logscale)   the alias-free SnakeBeta (`AliasFreeSnakeBeta`)
  causal_conv1d(x, weight, bias, dilation, residual)       left zero pad + conv1d [+ residual add]
  causal_conv_transpose1d(x, weight, bias, stride)         conv_transpose1d, keep the first L*stride samples
(`dilation` and `stride` are one-element int lists, as ATen's conv schemas take them.)
  amp_average(b1, b2, b3, divisor)                         ((b1 + b2) + b3) / divisor

Ops know nothing of graphs, patterns or the API.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from rewrite.ops import dispatch
from rewrite.kernels.alias_free.geometry import DOWN_PAD, FILTER_TAPS, RESAMPLE_RATIO, SNAKE_EPS, UP_CROP, UP_PAD

aten = torch.ops.aten



# ---- alias-free SnakeBeta ---------------------------------------------------------------------------------
def alias_free_snake_exact_reference(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool) -> Tensor:
    """`AliasFreeSnakeBeta.forward` call for call: upsample x2, SnakeBeta, causal low-pass and decimate x2.

    ``taps`` is the module's ``[1, 1, 12]`` buffer; ``alpha``/``beta`` are the per-channel parameters as
    stored. ``1.0 / t`` is what Python's ``__rtruediv__`` runs: ``reciprocal(t) * 1.0``.
    """
    channels = x.shape[1]
    padded = aten.pad.default(x, [UP_PAD, UP_PAD], "replicate")
    up = aten.conv_transpose1d.default(padded, aten.expand.default(taps, [channels, -1, -1]), None,
                                       [RESAMPLE_RATIO], [0], [0], channels)
    u = aten.slice.Tensor(aten.mul.Tensor(up, RESAMPLE_RATIO), 2, UP_CROP, -UP_CROP)
    a = aten.view.default(alpha, [1, -1, 1])
    b = aten.view.default(beta, [1, -1, 1])
    if logscale:
        a, b = aten.exp.default(a), aten.exp.default(b)
    inv_b = aten.mul.Tensor(aten.reciprocal.default(aten.add.Tensor(b, SNAKE_EPS)), 1.0)
    v = aten.add.Tensor(u, aten.mul.Tensor(inv_b, aten.pow.Tensor_Scalar(aten.sin.default(aten.mul.Tensor(u, a)), 2)))
    return aten.conv1d.default(aten.pad.default(v, [DOWN_PAD, 0], "replicate"),
                               aten.expand.default(taps, [channels, -1, -1]), None, [RESAMPLE_RATIO], [0], [1],
                               channels)


EXACT_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def exact_kernel_unsupported_reason(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor) -> Optional[str]:
    """None when the Triton path of ``alias_free_snake_exact`` may serve this call, else why not.

    `rewrite.ops.dispatch.kernel_unsupported_reason` (device, dtype, autograd, compiling), plus the shapes,
    dtypes and layout the kernels assume.
    """
    reason = dispatch.kernel_unsupported_reason("alias_free_snake_exact", (x, alpha, beta, taps), EXACT_KERNEL_DTYPES)
    if reason is not None:
        return reason
    if x.dim() != 3 or x.shape[0] * x.shape[1] == 0 or x.shape[2] < 1:
        return f"x {tuple(x.shape)} is not a non-empty [B, C, T]"
    for name, t, count in (("alpha", alpha, x.shape[1]), ("beta", beta, x.shape[1]), ("taps", taps, FILTER_TAPS)):
        if t.numel() != count or t.dtype != x.dtype:
            return f"{name} {tuple(t.shape)} {t.dtype} is not {count} values of {x.dtype}"
    return None


def choose_exact_implementation(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor) -> tuple[str, Optional[str]]:
    """``("triton", None)`` or ``("reference", reason)``: what ``alias_free_snake_exact`` runs for these inputs.

    Raises ValueError when the backend is forced to "triton" and the kernels cannot serve the call.
    """
    return dispatch.choose("alias_free_snake_exact", lambda: exact_kernel_unsupported_reason(x, alpha, beta, taps))


def alias_free_snake_exact_kernels(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool) -> Tensor:
    """The reference with its pads and elementwise chain run by `rewrite.kernels.alias_free.exact` (bit-identical).

    The convolutions and the per-channel parameters are the reference's ATen calls, with its arguments.
    """
    from rewrite.kernels.alias_free import exact as triton_auk

    channels = x.shape[1]
    # Any layout (e.g. the causal transposed conv's cropped view, the first input of every AMP stage):
    # the copy moves values only, and the reference's replicate pad materializes a contiguous tensor too.
    padded = triton_auk.replicate_pad1d(x.contiguous(), UP_PAD, UP_PAD)
    up = aten.conv_transpose1d.default(padded, aten.expand.default(taps, [channels, -1, -1]), None,
                                       [RESAMPLE_RATIO], [0], [0], channels)
    a = aten.view.default(alpha, [1, -1, 1])
    b = aten.view.default(beta, [1, -1, 1])
    if logscale:
        a, b = aten.exp.default(a), aten.exp.default(b)
    inv_b = aten.mul.Tensor(aten.reciprocal.default(aten.add.Tensor(b, SNAKE_EPS)), 1.0)
    vpad = triton_auk.snake_exact(up, a, inv_b, RESAMPLE_RATIO, UP_CROP, DOWN_PAD)
    return aten.conv1d.default(vpad, aten.expand.default(taps, [channels, -1, -1]), None, [RESAMPLE_RATIO], [0], [1],
                               channels)


@torch.library.custom_op("rewrite::alias_free_snake_exact", mutates_args=())
def alias_free_snake_exact(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool) -> Tensor:
    """Alias-free SnakeBeta ``[B, C, T] -> [B, C, T]``, bit-identical to the eager module (lossless).

    The Triton path (`alias_free_snake_exact_kernels`) where `choose_exact_implementation` allows it, else
    the reference.
    """
    if choose_exact_implementation(x, alpha, beta, taps)[0] == "triton":
        return alias_free_snake_exact_kernels(x, alpha, beta, taps, logscale)
    return alias_free_snake_exact_reference(x, alpha, beta, taps, logscale)


@alias_free_snake_exact.register_fake
def _(x, alpha, beta, taps, logscale):
    return x.new_empty(x.shape)


@torch.library.custom_op("rewrite::alias_free_snake_module", mutates_args=())
def alias_free_snake_module(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool) -> Tensor:
    """One `AliasFreeSnakeBeta` call, as the AuK capture records it: the module's ATen calls, nothing else.

    The capture (`rewrite.models.auk.capture.capture_auk_decode`) traces each activation module as this one node
    instead of its 15 ATen ops, which makes the export of the full decoder about 3x faster; the
    ``alias_free_activation`` patterns then replace the node by the level's implementation. Where no pattern
    does (``logscale=False``), it runs `alias_free_snake_exact_reference`: ``torch.equal`` to the module.
    """
    return alias_free_snake_exact_reference(x, alpha, beta, taps, logscale)


@alias_free_snake_module.register_fake
def _(x, alpha, beta, taps, logscale):
    return x.new_empty(x.shape)


# ---- causal conv1d (+ residual) ---------------------------------------------------------------------------
def causal_conv1d_reference(x: Tensor, weight: Tensor, bias: Optional[Tensor], dilation: list[int],
                            residual: Optional[Tensor]) -> Tensor:
    """`CausalConv1d.forward`: zero-pad ``dilation * (k - 1)`` on the left, conv1d (stride 1, no padding);
    with ``residual``, then `AMPBlock`'s ``residual + conv`` (in that operand order)."""
    left = dilation[0] * (weight.shape[-1] - 1)
    y = aten.conv1d.default(aten.pad.default(x, [left, 0]), weight, bias, [1], [0], dilation, 1)
    return y if residual is None else aten.add.Tensor(residual, y)


@torch.library.custom_op("rewrite::causal_conv1d", mutates_args=())
def causal_conv1d(x: Tensor, weight: Tensor, bias: Optional[Tensor], dilation: list[int],
                  residual: Optional[Tensor]) -> Tensor:
    """Causal (left zero-padded) conv1d, optionally added to a residual: ``[B, Cin, T] -> [B, Cout, T]``."""
    return causal_conv1d_reference(x, weight, bias, dilation, residual)


@causal_conv1d.register_fake
def _(x, weight, bias, dilation, residual):
    return x.new_empty((x.shape[0], weight.shape[0], x.shape[2]))


# ---- causal transposed conv (crop) ------------------------------------------------------------------------
def causal_conv_transpose1d_reference(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: list[int]) -> Tensor:
    """`CausalConvTranspose1d.forward`: conv_transpose1d (padding 0), then ``[..., :L * stride]``.

    Returns the same strided view of the full transposed-conv output that the eager module returns.
    """
    y = aten.conv_transpose1d.default(x, weight, bias, stride, [0], [0], 1, [1])
    return aten.slice.Tensor(y, 2, None, x.shape[-1] * stride[0])


@torch.library.custom_op("rewrite::causal_conv_transpose1d", mutates_args=())
def causal_conv_transpose1d(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: list[int]) -> Tensor:
    """Causal upsampling transposed conv: ``[B, Cin, L] -> [B, Cout, L * stride]``."""
    return causal_conv_transpose1d_reference(x, weight, bias, stride)


@causal_conv_transpose1d.register_fake
def _(x, weight, bias, stride):
    batch, _, length = x.shape
    full = (length - 1) * stride[0] + weight.shape[-1]
    return x.new_empty((batch, weight.shape[1], full))[:, :, : length * stride[0]]  # the view's strides, too


# ---- average of the AMP blocks ----------------------------------------------------------------------------
@torch.library.custom_op("rewrite::amp_average", mutates_args=())
def amp_average(b1: Tensor, b2: Tensor, b3: Tensor, divisor: int) -> Tensor:
    """`AuKDecoder.amp_blocks`' ``(b1 + b2 + b3) / 3``, in ATen's evaluation order: ``((b1 + b2) + b3) / 3``."""
    return aten.div.Tensor(aten.add.Tensor(aten.add.Tensor(b1, b2), b3), divisor)


@amp_average.register_fake
def _(b1, b2, b3, divisor):
    return torch.empty_like(b1)
