"""Softmax attention without mask for wide heads (Wan 2.1's middle block: one head of dim 384), as one Triton
flash-attention kernel (Hopper: TMA loads).

Computes, for q, k, v ``[N, H, L, D]`` (each row of D contiguous, the rows of all heads one strided run, as the
views of Wan's fused qkv projection are)::

    out = softmax(q @ k^T * D ** -0.5) @ v        (per (n, h); `scaled_dot_product_attention`'s defaults)

into a new contiguous ``[N, H, L, D]`` tensor. PyTorch's flash and cuDNN attention serve head dims up to 256, so
a head of 384 runs in the slower memory-efficient kernel; this one serves it (timings: docs/tuning.md
section 1.13).

Kernel: one program holds ``BLOCK_M`` queries and runs over the keys ``BLOCK_N`` at a time with the online
softmax (running max and sum in fp32, the logits in base 2 with the scale folded in). The head dim is held in
``CHUNKS`` pieces of ``CHUNK`` (<= 3 x 128) channels, each its own TMA box (a box side is at most 256) and its
own fp32 accumulator, so the output ``BLOCK_M x D`` stays in registers across the program's two warpgroups. The
probabilities are rounded to the activation dtype for the second product (as flash attention does); the output
is divided by the sum and rounded once.

Exactness: ``tolerance`` (level ``channels_last`` only): the sums run in another order than the
memory-efficient kernel's, and the probabilities are rounded to bf16/fp16 before the second product.

Preconditions (`unsupported_reason`): Triton with tensor descriptors, q, k, v of one bf16/fp16 dtype and one
shape with D a multiple of 64 up to 384, rows of 16-byte aligned strides.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.ops.dispatch import triton
from rewrite.kernels.launch import launch

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton before host tensor descriptors
    TensorDescriptor = None

__all__ = ["AttentionTile", "SUPPORTED_DTYPES", "attention", "launch_config", "unsupported_reason"]

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
MAX_CHUNKS = 3  # head-dim pieces the kernel unrolls


class AttentionTile(NamedTuple):
    """A launch configuration: `block_m` queries per program, `block_n` keys per step, `warps`, pipeline
    `stages`."""

    block_m: int
    block_n: int
    warps: int
    stages: int


def launch_config(head_dim: int) -> AttentionTile:
    """The tile for a head dim: 128 queries on 8 warps (two warpgroups of 64 rows; the 128 x 384 fp32 output is
    192 registers a thread, no spills on sm_90), 32 keys a step in 2 stages (Q and two stages of K and V: 192 KB
    of shared memory at D = 384). The fastest of the tiles swept at head dim 384 (docs/tuning.md section
    1.13)."""
    return AttentionTile(128, 32, 8, 2)


def _chunk(head_dim: int) -> int:
    return 128 if head_dim % 128 == 0 else 64


def _rows(t: Tensor) -> Optional[Tensor]:
    """The [N * H * L, D] view of a [N, H, L, D] tensor whose rows are one strided run, else None."""
    n, h, length, d = t.shape
    row = t.stride(2)
    if t.stride(3) != 1 or (h > 1 and t.stride(1) != length * row) or (n > 1 and t.stride(0) != h * length * row):
        return None
    return t.as_strided((n * h * length, d), (row, 1))


def unsupported_reason(q: Tensor, k: Tensor, v: Tensor) -> Optional[str]:
    """None when the kernel serves these operands, else why not."""
    if triton is None or TensorDescriptor is None:
        return "this Triton has no tensor descriptors"
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        return f"expected q, k, v of one [N, H, L, D] shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"{q.dtype}, {k.dtype}, {v.dtype}: the kernel serves one of bf16 / fp16"
    d = q.shape[3]
    if d % 64 or d // _chunk(d) > MAX_CHUNKS:
        return f"head dim {d} (multiples of 64 up to {MAX_CHUNKS * 128} served)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        rows = _rows(t)
        if rows is None:
            return f"{name}'s rows are not one strided run (strides {tuple(t.stride())})"
        if (rows.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return f"{name}'s rows are not 16-byte aligned"
    return None


if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import dot as _dot
    from rewrite.kernels.aten_math import round_to as _round

    @triton.jit
    def _attention_kernel(q_desc, k_desc, v_desc, o_desc, L, qk_scale, CHUNKS: tl.constexpr, CHUNK: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
        """One program: queries start_m.. (BLOCK_M) of head `head` (program ids 0 and 1). q, k, v descriptors
        view the rows of every head as one [N * H * L, D] matrix: a key block past L reads another head's rows
        (their logits are masked to -inf) or TMA's zero fill; the output's [N * H, L, D] view clips at L."""
        start_m = tl.program_id(0) * BLOCK_M
        head = tl.program_id(1)
        row = head * L + start_m
        dtype: tl.constexpr = q_desc.dtype
        q0 = q_desc.load([row, 0])
        q1 = q0
        q2 = q0
        if CHUNKS > 1:
            q1 = q_desc.load([row, CHUNK])
        if CHUNKS > 2:
            q2 = q_desc.load([row, 2 * CHUNK])
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc0 = tl.zeros([BLOCK_M, CHUNK], tl.float32)
        acc1 = tl.zeros([BLOCK_M, CHUNK], tl.float32)
        acc2 = tl.zeros([BLOCK_M, CHUNK], tl.float32)
        for start_n in tl.range(0, L, BLOCK_N, num_stages=STAGES):
            key = head * L + start_n
            s = _dot(q0, k_desc.load([key, 0]).T, tl.zeros([BLOCK_M, BLOCK_N], tl.float32))
            if CHUNKS > 1:
                s = _dot(q1, k_desc.load([key, CHUNK]).T, s)
            if CHUNKS > 2:
                s = _dot(q2, k_desc.load([key, 2 * CHUNK]).T, s)
            s = tl.where((start_n + tl.arange(0, BLOCK_N) < L)[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            p = _round(p, dtype)
            acc0 = _dot(p, v_desc.load([key, 0]), acc0 * alpha[:, None])
            if CHUNKS > 1:
                acc1 = _dot(p, v_desc.load([key, CHUNK]), acc1 * alpha[:, None])
            if CHUNKS > 2:
                acc2 = _dot(p, v_desc.load([key, 2 * CHUNK]), acc2 * alpha[:, None])
            m_i = m_new
        inverse = (1.0 / l_i)[:, None]
        o_desc.store([head, start_m, 0], tl.reshape(_round(acc0 * inverse, dtype), [1, BLOCK_M, CHUNK]))
        if CHUNKS > 1:
            o_desc.store([head, start_m, CHUNK], tl.reshape(_round(acc1 * inverse, dtype), [1, BLOCK_M, CHUNK]))
        if CHUNKS > 2:
            o_desc.store([head, start_m, 2 * CHUNK], tl.reshape(_round(acc2 * inverse, dtype), [1, BLOCK_M, CHUNK]))


def attention(q: Tensor, k: Tensor, v: Tensor, config: Optional[AttentionTile] = None) -> Tensor:
    """``softmax(q @ k^T / sqrt(D)) @ v`` for q, k, v [N, H, L, D] by the kernel of the module docstring, into a new
    contiguous tensor. Raises ValueError where `unsupported_reason` declines."""
    reason = unsupported_reason(q, k, v)
    if reason is not None:
        raise ValueError(f"attention: {reason}")
    n, h, length, d = q.shape
    out = torch.empty((n, h, length, d), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    tile = config or launch_config(d)
    chunk = _chunk(d)
    q_desc, k_desc, v_desc = (TensorDescriptor.from_tensor(_rows(t), [block, chunk])
                              for t, block in ((q, tile.block_m), (k, tile.block_n), (v, tile.block_n)))
    o_desc = TensorDescriptor.from_tensor(out.view(n * h, length, d), [1, tile.block_m, chunk])
    grid = (triton.cdiv(length, tile.block_m), n * h)
    launch(_attention_kernel, grid, q_desc, k_desc, v_desc, o_desc, length, d ** -0.5 * math.log2(math.e),
           CHUNKS=d // chunk, CHUNK=chunk, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, STAGES=tile.stages,
           num_warps=tile.warps, exact=False)
    return out
