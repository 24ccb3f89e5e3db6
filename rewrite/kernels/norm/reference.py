"""What the norm kernels compute, as the ATen ops of the subgraph they replace (Wan's `WanRMS_norm` + SiLU).

The kernels fall back to it where they do not serve a call and compute their output layouts from it; the
`rewrite::rms_norm` op runs it as its reference. Imports no kernel.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

aten = torch.ops.aten


# ---- RMS norm (+ SiLU) -------------------------------------------------------------------------------
def rms_norm_reference(x: Tensor, gamma: Tensor, scale: float, bias: float, eps: float, upcast: bool,
                       act: Optional[str]) -> Tensor:
    """`normalize(x[.float()], dim=1)[.to(x.dtype)] * scale * gamma + bias`, then the activation."""
    xf = aten.to.dtype(x, torch.float32) if upcast else x
    y = aten.div.Tensor(xf, aten.expand_as.default(aten.clamp_min.default(
        aten.linalg_vector_norm.default(xf, 2.0, [1], True), eps), xf))
    if upcast:
        y = aten.to.dtype(y, x.dtype)
    y = aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(y, scale), gamma), bias)
    return aten.silu.default(y) if act == "silu" else y
