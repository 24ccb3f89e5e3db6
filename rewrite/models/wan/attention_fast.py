"""Softmax attention of a wide head at level ``channels_last`` (exactness class ``tolerance``): Wan 2.1's middle
block (one head of dim 384) by the Triton flash-attention kernel (`rewrite.kernels.attention.attention`) instead of
PyTorch's memory-efficient sm80 kernel, the only one of its backends that serves a head past 256.

`attention_fast(q, k, v)` is ``scaled_dot_product_attention(q, k, v)`` with its defaults (no mask, no dropout,
not causal, scale ``D ** -0.5``) and returns its layout (its fake runs that op). Where a call is not served
(`attention_reason`; the kernel's own preconditions; no kernel on this device; autograd), the replaced
``scaled_dot_product_attention`` runs: its answer, never a wrong one.

Tolerance: the kernel's sums run in another order and its probabilities are rounded to the activation dtype
before the second product, as flash attention's are (`triton_attention`); measured in docs/tuning.md section
1.13 and within the level's full-decode contract (README).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from rewrite.kernels.attention import attention as triton_attention
from rewrite.ops.dispatch import use_kernel
from rewrite.kernels.layout import reference_layout

__all__ = ["attention_fast", "attention_reason"]

aten = torch.ops.aten

# Head dims whose attention the Triton kernel ran faster on the H200 than scaled_dot_product_attention's choice
# (docs/tuning.md section 1.13).
_FASTER_THAN_SDPA: frozenset = frozenset({384})


def attention_reason(shape, dtype: torch.dtype) -> Optional[str]:
    """None when `attention_fast`'s kernel serves the attention of q, k, v of this [N, H, L, D] shape and dtype
    (bf16/fp16, a head dim measured faster); else why `scaled_dot_product_attention` runs it. Read by the
    pattern's guard on the graph's shapes and by the op on its tensors."""
    if len(shape) != 4:
        return f"expected [N, H, L, D] operands, got {len(shape)}-D"
    if dtype not in triton_attention.SUPPORTED_DTYPES:
        return f"{dtype} keeps scaled_dot_product_attention (the kernel serves bf16 / fp16)"
    if shape[3] not in _FASTER_THAN_SDPA:
        return f"the kernel is not measured faster than scaled_dot_product_attention for head dim {shape[3]}"
    return None


@torch.library.custom_op("rewrite::attention_fast", mutates_args=())
def attention_fast(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``scaled_dot_product_attention(q, k, v)`` by `triton_attention.attention` where `attention_reason` and the
    kernel's preconditions allow (module docstring), written in the layout that op returns."""
    if (attention_reason(q.shape, q.dtype) is None and triton_attention.unsupported_reason(q, k, v) is None
            and use_kernel("attention_fast", (q, k, v), triton_attention.SUPPORTED_DTYPES)):
        out = triton_attention.attention(q, k, v)
        strides = reference_layout(("scaled_dot_product_attention",), F.scaled_dot_product_attention, q, k, v)
        if torch.empty_strided(out.shape, strides, device="meta").is_contiguous():  # out's order, size-1 dims aside
            return out.as_strided(out.shape, strides)
        return torch.empty_strided(out.shape, strides, dtype=out.dtype, device=out.device).copy_(out)
    return aten.scaled_dot_product_attention.default(q, k, v)


@attention_fast.register_fake
def _(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)
