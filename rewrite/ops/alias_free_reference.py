"""Reference of AuK's alias-free SnakeBeta and of the activation feeding a causal conv, and the argument
checks every implementation shares. Imports no kernel.

`alias_free_snake_reference` is the eager `rewrite.models.auk.AliasFreeSnakeBeta` computation call for call
(``torch.equal`` to the module on every device and dtype); `alias_free_snake_causal_conv1d_reference` is the
pair of ops ``rewrite::alias_free_snake_causal_conv1d`` replaces, each run as its own op.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from rewrite.ops.alias_free_geometry import DOWN_PAD, FILTER_TAPS, RESAMPLE_RATIO, SNAKE_EPS, UP_CROP, UP_PAD
from rewrite.ops.auk import causal_conv1d_reference


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


def validate(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor) -> None:
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


def alias_free_snake_causal_conv1d_reference(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool,
                                             weight: Tensor, bias: Optional[Tensor], dilation: list[int],
                                             residual: Optional[Tensor], x_bias: Optional[Tensor] = None) -> Tensor:
    """``causal_conv1d(alias_free_snake(x + x_bias), ...)``: the ops this one fuses, each as its own op runs
    (``x_bias``: the bias of the conv that produced x, deferred to here; None for none)."""
    if x_bias is not None:
        x = torch.ops.aten.add.Tensor(x, x_bias.view(1, -1, 1))
    activation = torch.ops.rewrite.alias_free_snake.default(x, alpha, beta, taps, logscale)
    return causal_conv1d_reference(activation, weight, bias, dilation, residual)
