"""Wan 2.1's middle-block attention (one head of dim 384) by our flash-attention kernel (level ``channels_last``).

Matches:  aten.scaled_dot_product_attention(q, k, v) with its defaults (no mask, no dropout, not causal, the
          default scale: a node with any other argument does not match)
Replaces: rewrite::attention_fast(q, k, v) (`rewrite.models.wan.attention_fast`): the Triton flash-attention kernel,
          whose head dim is held in pieces of 128 channels (PyTorch's flash and cuDNN attention stop at 256).
Exactness: tolerance. The sums run in another order than the memory-efficient kernel's and the probabilities
          are rounded to the activation dtype before the second product (the README's `channels_last`
          contract; measured in docs/tuning.md section 1.13). Where the op's kernel path does not serve a call,
          it runs the replaced op.
Level: channels_last.
Guard: the graph runs on CUDA (or on CPU under the Triton interpreter, for tests), and
          `attention_fast.attention_reason` accepts q's shape and dtype: bf16/fp16, a head dim measured faster.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import attention_fast
from rewrite.patterns.common.guards import triton_kernel_runs

aten = torch.ops.aten
rewrite_ops = torch.ops.rewrite


def search(q, k, v):
    return aten.scaled_dot_product_attention.default(q, k, v)


def replace(q, k, v):
    return rewrite_ops.attention_fast.default(q, k, v)


def guard(match) -> str | None:
    q = match.inputs["q"].meta["val"]
    reason = triton_kernel_runs(q.device, "the attention kernel")
    if reason is not None:
        return reason
    return attention_fast.attention_reason(tuple(q.shape), q.dtype)


PATTERNS = variants(search, replace, guard, name="attention_fast", exactness="tolerance", level="channels_last",
                    module_types=("WanAttentionBlock",))
