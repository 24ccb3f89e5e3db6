"""RMS norm (+SiLU) as used by the Wan decoder (`WanRMS_norm`, channel-first, then `nonlinearity`).

Matches:  [x.float()] -> linalg_vector_norm(., 2, [1], keepdim) -> clamp_min(eps) -> expand_as -> div
          -> [.to(x.dtype)] -> * scale -> * gamma -> + bias [-> silu]
          (the fp32 upcast appears for bf16/fp16 inputs; `scale` is the per-layer sqrt(C), a placeholder)
Replaces: rewrite::rms_norm(x, gamma, scale, bias, eps, upcast, act)
Exactness: exact (the op sums the fp32 norm in ATen's order, `rewrite.kernels.norm.aten_reduction`, or runs ATen's
          reduction where that order is not reproduced, and keeps every rounding point of the subgraph).
Level: lossless.
Guard: x is 4-D or 5-D; with the upcast (variant `half`), x has that half dtype; gamma has
x's dtype and one value per channel.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten


def search(x, gamma, scale, bias, eps, half, act):
    upcast = half is not None
    xf = aten.to.dtype(x, torch.float32) if upcast else x
    y = aten.div.Tensor(xf, aten.expand_as.default(aten.clamp_min.default(
        aten.linalg_vector_norm.default(xf, 2.0, [1], True), eps), xf))
    if upcast:
        y = aten.to.dtype(y, half)
    y = aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(y, scale), gamma), bias)
    return aten.silu.default(y) if act == "silu" else y


def replace(x, gamma, scale, bias, eps, half, act):
    return torch.ops.rewrite.rms_norm.default(x, gamma, scale, bias, eps, half is not None, act)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    gamma = match.inputs["gamma"].meta["val"]
    half = dict(match.pattern.variant)["half"]
    if x.dim() not in (4, 5):
        return f"x is {x.dim()}-D, expected 4-D or 5-D"
    if half is not None and x.dtype != half:
        return f"the fp32 round trip casts back to {half}, but x is {x.dtype}"
    if gamma.dtype != x.dtype or gamma.numel() != x.shape[1]:
        return f"gamma {tuple(gamma.shape)} {gamma.dtype} does not match x's {x.shape[1]} channels of {x.dtype}"
    return None


PATTERNS = variants(
    search, replace, guard, name="rms_norm", exactness="exact", level="lossless",
    scalars=("scale", "bias", "eps"), module_types=("WanRMS_norm",),
    act=("silu", None), half=(torch.bfloat16, torch.float16, None),
)
