"""Reference of AuK's alias-free SnakeBeta and of the activation feeding a causal conv, and the argument
checks every implementation shares. Imports no kernel.

`alias_free_snake_reference` is the eager `rewrite.models.auk.model.AliasFreeSnakeBeta` computation call for call
(``torch.equal`` to the module on every device and dtype); `alias_free_snake_causal_conv1d_reference` is the
pair of ops ``rewrite::alias_free_snake_causal_conv1d`` replaces, each run as its own op.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from rewrite.kernels.alias_free.geometry import DOWN_PAD, FILTER_TAPS, RESAMPLE_RATIO, SNAKE_EPS, UP_CROP, UP_PAD
from rewrite.kernels.alias_free.geometry import validate  # noqa: F401  (the ops' input check)
from rewrite.models.auk.ops import causal_conv1d_reference


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


def alias_free_snake_causal_conv1d_reference(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool,
                                             weight: Tensor, bias: Optional[Tensor], dilation: list[int],
                                             residual: Optional[Tensor], x_bias: Optional[Tensor] = None) -> Tensor:
    """``causal_conv1d(alias_free_snake(x + x_bias), ...)``: the ops this one fuses, each as its own op runs
    (``x_bias``: the bias of the conv that produced x, deferred to here; None for none)."""
    if x_bias is not None:
        x = torch.ops.aten.add.Tensor(x, x_bias.view(1, -1, 1))
    activation = torch.ops.rewrite.alias_free_snake.default(x, alpha, beta, taps, logscale)
    return causal_conv1d_reference(activation, weight, bias, dilation, residual)
