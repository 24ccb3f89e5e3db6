"""Custom ops for the AuK decoder's fusion families, in the `rewrite` torch.library namespace.

Every op here is its *reference implementation*: the ATen calls, in the order and with the arguments, that
the eager `rewrite.models.auk` modules make (and that the captured subgraph it replaces holds), so a
rewritten graph is ``torch.equal`` to the captured one on any device and dtype. Each op has a fake
implementation for export/compile tracing. Faster kernels plug in behind these signatures and must keep
them bit-identical (the *tolerance* alias-free kernel is a separate op, ``rewrite::alias_free_snake`` in
`rewrite.ops.alias_free`).

Ops:
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

aten = torch.ops.aten

# Geometry of the alias-free activation (fixed by the AuK decoder; see rewrite.models.auk).
NUM_TAPS = 12
RATIO = 2
UP_PAD = 5
UP_CROP = 15
DOWN_PAD = 11
SNAKE_EPS = 1e-9


# ---- alias-free SnakeBeta ---------------------------------------------------------------------------------
def alias_free_snake_exact_reference(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool) -> Tensor:
    """`AliasFreeSnakeBeta.forward` call for call: upsample x2, SnakeBeta, causal low-pass and decimate x2.

    ``taps`` is the module's ``[1, 1, 12]`` buffer; ``alpha``/``beta`` are the per-channel parameters as
    stored. ``1.0 / t`` is what Python's ``__rtruediv__`` runs: ``reciprocal(t) * 1.0``.
    """
    channels = x.shape[1]
    padded = aten.pad.default(x, [UP_PAD, UP_PAD], "replicate")
    up = aten.conv_transpose1d.default(padded, aten.expand.default(taps, [channels, -1, -1]), None,
                                       [RATIO], [0], [0], channels)
    u = aten.slice.Tensor(aten.mul.Tensor(up, RATIO), 2, UP_CROP, -UP_CROP)
    a = aten.view.default(alpha, [1, -1, 1])
    b = aten.view.default(beta, [1, -1, 1])
    if logscale:
        a, b = aten.exp.default(a), aten.exp.default(b)
    inv_b = aten.mul.Tensor(aten.reciprocal.default(aten.add.Tensor(b, SNAKE_EPS)), 1.0)
    v = aten.add.Tensor(u, aten.mul.Tensor(inv_b, aten.pow.Tensor_Scalar(aten.sin.default(aten.mul.Tensor(u, a)), 2)))
    return aten.conv1d.default(aten.pad.default(v, [DOWN_PAD, 0], "replicate"),
                               aten.expand.default(taps, [channels, -1, -1]), None, [RATIO], [0], [1], channels)


@torch.library.custom_op("rewrite::alias_free_snake_exact", mutates_args=())
def alias_free_snake_exact(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool) -> Tensor:
    """Alias-free SnakeBeta ``[B, C, T] -> [B, C, T]``, bit-identical to the eager module (lossless)."""
    return alias_free_snake_exact_reference(x, alpha, beta, taps, logscale)


@alias_free_snake_exact.register_fake
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
