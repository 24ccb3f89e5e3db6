"""Ulp bounds for the tolerance tests of the ``channels_last`` kernels (bf16 / fp16 outputs against float64).

`within_one_ulp`: a kernel that rounds its fp32 sum once is within half an output ulp of that sum, which is within
n * 2**-24 * sum|terms| of the exact value (n terms, the standard recursive-summation bound); the check allows one
ulp of the output dtype (at the larger of the two values) plus that bound.
"""

from __future__ import annotations

import torch


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One ulp of `dtype` at |values| (float64)."""
    mantissa = {torch.bfloat16: 8, torch.float16: 11}[dtype]
    exponent = torch.floor(torch.log2(values.abs().clamp_min(2.0 ** -14)))
    return torch.pow(2.0, exponent - (mantissa - 1))


def within_one_ulp(out: torch.Tensor, reference: torch.Tensor, magnitude: torch.Tensor, terms: int) -> None:
    """|out - reference| <= 1 ulp + terms * 2**-24 * magnitude (sum of |terms|; module docstring)."""
    error = (out.double() - reference).abs()
    bound = ulp(torch.maximum(reference.abs(), out.double().abs()), out.dtype) + terms * 2.0 ** -24 * magnitude
    assert bool((error <= bound).all()), f"max error {error.max().item():.3g}, worst excess {(error - bound).max().item():.3g}"
