"""The ``channels_last`` middle-block attention: the Triton flash-attention kernel, its op, routing and pattern.

Tolerance of the kernel tests: q . k sums of bf16 products run in fp32 (exact products, relative error about
D * 2**-24: negligible here), and the kernel rounds two things: each probability to bf16 before the second
product (bf16's unit roundoff, 2**-8 relative, so the output moves by at most 2**-8 * sum_j p_j |v_j|) and the
output once (2**-8 * |out|). The bound is the sum of the two plus 1e-6 for the exp2 and fp32 sums.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewrite.models.wan import attention_fast
from rewrite.kernels.attention import attention as triton_attention
from rewrite.ops.dispatch import INTERPRETING
from rewrite.kernels.attention.attention import AttentionTile

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")


def _qkv(n: int, h: int, length: int, d: int, seed: int = 0, dtype=torch.bfloat16):
    """q, k, v as Wan's attention makes them: views of one [N, H, L, 3D] projection."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(n, h, length, 3 * d, generator=g) * 1.5).to(dtype).to(DEVICE)
    return qkv.chunk(3, dim=-1)


def _check(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    weighted = F.scaled_dot_product_attention(q.double(), k.double(), v.double().abs())  # sum_j p_j |v_j|
    bound = 2.0 ** -8 * (weighted + reference.abs()) + 1e-6
    error = (out.double() - reference).abs()
    assert bool((error <= bound).all()), f"max error {error.max().item():.3g}, worst excess {(error - bound).max():.3g}"


@needs_kernels
@pytest.mark.parametrize("n,h,length,d,tile", [
    (1, 1, 300, 384, None),                          # Wan's head, the chosen tile: 3 pieces of 128, 128 queries
    (1, 1, 100, 384, AttentionTile(64, 32, 8, 2)),   # L not a multiple of a block
    (2, 1, 70, 128, AttentionTile(64, 32, 4, 1)),    # two frames: key blocks past L read the next frame's rows
    (1, 3, 50, 192, AttentionTile(64, 16, 4, 1)),    # three heads, 3 pieces of 64
    (1, 1, 1, 256, AttentionTile(64, 32, 4, 2)),     # one token
])
def test_kernel_is_softmax_attention(n, h, length, d, tile):
    q, k, v = _qkv(n, h, length, d)
    _check(triton_attention.attention(q, k, v, tile), q, k, v)


def test_kernel_names_what_it_does_not_serve():
    q, k, v = _qkv(1, 1, 8, 64)
    reason = triton_attention.unsupported_reason
    assert "head dim 448" in reason(*_qkv(1, 1, 8, 448))
    assert "one [N, H, L, D] shape" in reason(q, k[:, :, :4], v)
    assert "bf16 / fp16" in reason(q.float(), k.float(), v.float())
    assert "one strided run" in reason(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    with pytest.raises(ValueError, match="head dim 448"):
        triton_attention.attention(*_qkv(1, 1, 8, 448))


def test_attention_reason_names_what_declines():
    assert attention_fast.attention_reason((1, 1, 14400, 384), torch.bfloat16) is None
    assert "bf16 / fp16" in attention_fast.attention_reason((1, 1, 14400, 384), torch.float32)
    assert "head dim 64" in attention_fast.attention_reason((1, 1, 14400, 64), torch.bfloat16)
    assert "got 3-D" in attention_fast.attention_reason((1, 14400, 384), torch.bfloat16)


@needs_kernels
def test_op_runs_the_kernel_in_the_reference_layout(kernel_allowed_on_cpu, monkeypatch):
    ran = []
    original = triton_attention.attention
    monkeypatch.setattr(triton_attention, "attention", lambda *a, **k: ran.append(1) or original(*a, **k))
    q, k, v = _qkv(1, 1, 40, 384, seed=1)
    out = torch.ops.rewrite.attention_fast(q, k, v)
    reference = F.scaled_dot_product_attention(q, k, v)
    assert ran and out.shape == reference.shape and out.stride() == reference.stride()
    _check(out, q, k, v)


def test_op_runs_scaled_dot_product_attention_where_not_served(kernel_allowed_on_cpu):
    q, k, v = _qkv(1, 2, 40, 64, seed=2)
    assert torch.equal(torch.ops.rewrite.attention_fast(q, k, v), F.scaled_dot_product_attention(q, k, v))


def test_pattern_takes_the_attention_at_channels_last(monkeypatch):
    """A tiny Wan 2.1 captured on the CPU (standing in for a CUDA capture, as the other channels_last pattern
    tests): its one attention becomes `attention_fast` (its head dim admitted here); the family is declared
    for ``channels_last`` only (the engine's level gate is tested with the engine)."""
    from rewrite.models.wan.capture import capture_wan_decoder
    from rewrite.models.wan.config import build_wan
    from rewrite.ops import dispatch
    from rewrite.patterns.wan import attention_fast as pattern
    from rewrite.pipeline import rewrite_graph

    assert {p.level for p in pattern.PATTERNS} == {"channels_last"}
    monkeypatch.setattr(dispatch, "INTERPRETING", True)
    graph = capture_wan_decoder(build_wan("wan2.1", "tiny").to(torch.bfloat16).decoder, torch.bfloat16,
                                torch.device("cpu"))[0]
    sdpa = [n for n in graph.graph_module.graph.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
    monkeypatch.setattr(attention_fast, "_FASTER_THAN_SDPA", frozenset({sdpa[0].args[0].meta["val"].shape[3]}))
    rewrite_graph(graph, "channels_last")
    nodes = list(graph.graph_module.graph.nodes)
    assert sum(n.target is torch.ops.rewrite.attention_fast.default for n in nodes) == 1
    assert not any(n.target is torch.ops.aten.scaled_dot_product_attention.default for n in nodes)
