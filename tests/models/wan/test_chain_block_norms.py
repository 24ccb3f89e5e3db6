"""Linked Wan residual blocks (`rewrite::rms_norm_causal_conv3d_pair_fast_chain`, pass `chain_block_norms`):
a block's second conv stores its output and normalizes it into the next block's padded conv input.

Checks, each against the ops it replaces: the block output and the caches the pair op makes are `torch.equal`
to the pair op's (same kernel, same tile, same sum order); the normalized values are within one output ulp of
the float64 norm + SiLU of the stored output (the bound and its reasoning are `_check_pair`'s in
tests/models/wan/test_ops_fast.py: fp32 steps err by ~2e-5 relative after SiLU, far below the half ulp of the one
rounding); the padded input holds them where the reference assembly puts them, bit for bit; the next block run
on that padded input is the pair op run on the same padded input, bit for bit.
"""

from __future__ import annotations

import operator

import pytest
import torch

from rewrite.ops import dispatch
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.models.wan import ops as _wan_ops
from rewrite.models.wan.reference import causal_conv_input_reference, rms_norm_reference
from tests.captures import tiny_wan
from tests.op_cases import kernel_gates_open
from tests.models.wan.test_ops_fast import DEVICE, _pair_fused, _pair_inputs, needs_kernels
from tests.ulps import ulp

CL = torch.channels_last_3d
chain_op = torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast_chain
pair_op = torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast


def _next_norm(mode, c=16, h=3, w=19, dtype=torch.bfloat16, seed=5):
    """The second block's first norm (SiLU after it) and cache: gamma3, scale3, norm_bias3, eps3, upcast3, act3,
    cache3, pad3, mode3."""
    g = torch.Generator().manual_seed(seed)
    gamma = (1 + 0.1 * torch.randn(c, 1, 1, 1, generator=g)).to(dtype).to(DEVICE)
    cache = None if mode == "chunk0" else torch.randn(1, c, 2, h, w, generator=g).to(dtype).to(DEVICE)
    pad = [1, 1, 1, 1, 2, 0] if mode == "chunk0" else [1, 1, 1, 1, 0, 0]
    return (gamma, c ** 0.5, 0.0, 1e-12, True, "silu", cache, pad, mode)


def _producer(mode, residual_bias=False, w=24, **shape):
    """Two linked blocks' first op: the chain op with the next block's norm (w = 24: rows of the residual and
    the output are 16-byte aligned, so the fused epilogue can store them by TMA)."""
    args = _pair_inputs(mode, True, residual_bias, w=w, **shape)
    nxt = _next_norm(mode, c=args[0].shape[1], h=args[0].shape[3], w=w)
    return args, nxt, chain_op(args[0], None, *args[1:], *nxt)


def _check_next_input(out, nxt, padded3, next_cache3):
    gamma3, scale3, norm_bias3, eps3, _, _, cache3, pad3, mode3 = nxt
    y = out.double()
    v = torch.nn.functional.silu(y / torch.linalg.vector_norm(y, dim=1, keepdim=True).clamp_min(eps3) * scale3
                                 * gamma3.double() + norm_bias3)
    frames = out.shape[2]
    new = next_cache3[:, :, 2 - frames:]
    error = (new.double() - v[:, :, -min(frames, 2):]).abs()
    assert bool((error <= ulp(v[:, :, -min(frames, 2):], new.dtype)).all()), error.max().item()
    if frames < 2:  # the old cache's last frame first (steady_t1), or zeros (chunk 0)
        first = torch.zeros_like(new) if mode3 == "chunk0" else cache3[:, :, -1:]
        assert torch.equal(next_cache3[:, :, :1], first)
    assert next_cache3.is_contiguous(memory_format=CL) and padded3.is_contiguous(memory_format=CL)
    # every frame of the normalized output, as the padded input holds it (the epilogue stores all of them)
    start = pad3[4] + (0 if mode3 == "chunk0" else cache3.shape[2])
    held = padded3[:, :, start:start + frames, pad3[2]:pad3[2] + out.shape[3], pad3[0]:pad3[0] + out.shape[4]]
    assert torch.equal(held[:, :, -min(frames, 2):], new)
    rebuilt, _ = causal_conv_input_reference(held, cache3 if mode3 != "chunk0" else None, pad3, mode3)
    assert torch.equal(padded3, rebuilt)
    error = (held.double() - v).abs()
    assert bool((error <= ulp(v, held.dtype)).all()), error.max().item()


@needs_kernels
@pytest.mark.parametrize("mode", ["steady", "steady_t1", "chunk0"])
@pytest.mark.parametrize("residual_bias", [False, True])
def test_chain_producer_is_the_pair_op_and_the_next_norm(kernel_allowed_on_cpu, monkeypatch, mode, residual_bias):
    kernel_gates_open(monkeypatch)
    calls = _pair_fused(monkeypatch)
    args, nxt, (out, next_cache, next_cache2, padded3, next_cache3) = _producer(mode, residual_bias)
    assert len(calls) == 2 and calls[1] is not None, "the second conv's fused epilogue did not run"
    expected = pair_op(*args)
    assert all(torch.equal(a, e) and a.stride() == e.stride() for a, e in zip((out, next_cache, next_cache2), expected))
    _check_next_input(out, nxt, padded3, next_cache3)


@needs_kernels
def test_chain_producer_with_rows_tma_cannot_store_normalizes_after_the_conv(kernel_allowed_on_cpu, monkeypatch):
    """19 pixels a row: the NCDHW output's rows are not 16-byte aligned, so the second conv stores its output
    as the pair op does and the norm kernel reads it back (the exact kernel for 16 channels: ATen's values)."""
    kernel_gates_open(monkeypatch)
    calls = _pair_fused(monkeypatch)
    args, nxt, (out, _, _, padded3, next_cache3) = _producer("steady", w=19)
    assert calls == [None]  # the first conv's only
    assert torch.equal(out, pair_op(*args)[0])
    gamma3, scale3, norm_bias3, eps3, upcast3, act3, cache3, pad3, mode3 = nxt
    v = rms_norm_reference(out, gamma3, scale3, norm_bias3, eps3, upcast3, act3)
    ref_padded, ref_cache = causal_conv_input_reference(v, cache3, pad3, mode3)
    assert torch.equal(padded3, ref_padded) and torch.equal(next_cache3, ref_cache)


@needs_kernels
@pytest.mark.parametrize("mode", ["steady", "chunk0"])
def test_chain_consumer_convolves_the_padded_input_it_is_given(kernel_allowed_on_cpu, monkeypatch, mode):
    """The second block on the producer's padded input is the pair op whose first norm made that input."""
    kernel_gates_open(monkeypatch)
    args, nxt, (out, _, _, padded3, next_cache3) = _producer(mode)
    gamma3, scale3, norm_bias3, eps3, upcast3, act3, cache3, pad3, mode3 = nxt
    block2 = list(_pair_inputs(mode, False, False, seed=7, w=24))
    block2[0:10] = [out, gamma3, scale3, norm_bias3, eps3, upcast3, act3, cache3, pad3, mode3]
    block2[23] = out  # the identity shortcut
    linked = chain_op(block2[0], padded3, *block2[1:7], None, *block2[8:], *([None, 1.0, 0.0, 0.0, False, None, None,
                                                                              [0] * 6, "steady"]))
    assert linked[1].numel() == 0 and linked[3].numel() == 0 and linked[4].numel() == 0
    monkeypatch.setattr(wan_fast, "_normalized_input", lambda *a: (padded3, next_cache3))
    expected = pair_op(*block2)
    assert torch.equal(linked[0], expected[0]) and torch.equal(linked[2], expected[2])


def test_chain_off_the_kernel_path_is_its_definition():
    """CPU, fp32, no interpreter: the pair op, then the reference norm and input assembly; the consumer is
    ATen's conv of the padded input, then the fast op."""
    args = _pair_inputs("steady", True, True, dtype=torch.float32)
    nxt = _next_norm("steady", dtype=torch.float32)
    out, next_cache, next_cache2, padded3, next_cache3 = chain_op(args[0], None, *args[1:], *nxt)
    expected = pair_op(*args)
    assert all(torch.equal(a, e) for a, e in zip((out, next_cache, next_cache2), expected))
    gamma3, scale3, norm_bias3, eps3, upcast3, act3, cache3, pad3, mode3 = nxt
    v = rms_norm_reference(out, gamma3, scale3, norm_bias3, eps3, upcast3, act3)
    ref_padded, ref_cache = causal_conv_input_reference(v, cache3, pad3, mode3)
    assert torch.equal(padded3, ref_padded) and torch.equal(next_cache3, ref_cache)
    block2 = list(_pair_inputs("steady", False, False, dtype=torch.float32, seed=7))
    linked = chain_op(out, padded3, *block2[1:7], None, *block2[8:23], out, None,
                      *([None, 1.0, 0.0, 0.0, False, None, None, [0] * 6, "steady"]))
    y = _wan_ops.channels_last_conv_raw(padded3, block2[10]).contiguous(memory_format=CL)
    second = torch.ops.rewrite.rms_norm_causal_conv3d_fast(y, *block2[12:23], out, block2[11], None, False)
    assert torch.equal(linked[0], second[0]) and torch.equal(linked[2], second[1])


def test_chain_reason_names_why():
    assert wan_fast.chain_reason(96, 96, torch.bfloat16, "silu") is None
    assert "activation" in wan_fast.chain_reason(96, 96, torch.bfloat16, "gelu")
    assert "dtype" in wan_fast.chain_reason(96, 96, torch.float32, "silu")
    assert "not measured faster" in wan_fast.chain_reason(32, 96, torch.bfloat16, "silu")
    assert "span several programs" in wan_fast.chain_reason(384, 384, torch.bfloat16, "silu")


def test_the_pass_links_every_run_of_blocks(monkeypatch):
    """On a CPU capture standing in for a CUDA one (as the pair pattern's test): every pair op whose input is
    another block's output through an identity shortcut is linked; the graph still lints and every linked
    node's padded input comes from the node before."""
    from rewrite.pipeline import rewrite_graph

    monkeypatch.setattr(dispatch, "conv_bias_is_separate", lambda device: True)
    monkeypatch.setattr(dispatch, "INTERPRETING", True)
    kernel_gates_open(monkeypatch)
    linked, declined = 0, {}
    for graph in tiny_wan("wan2.1", torch.bfloat16)[1]:
        rewrite_graph(graph, "channels_last")
        nodes = list(graph.graph_module.graph.nodes)
        for node in nodes:
            if node.target is chain_op.default and node.args[1] is not None:
                producer = node.args[1].args[0]
                assert node.args[1].target is operator.getitem and producer.target is chain_op.default
                assert node.args[8] is None  # the cache is read by the producer
                linked += 1
            if node.target is pair_op.default:
                x = node.args[0]
                assert not (x.target is operator.getitem and x.args[0].target in (pair_op.default, chain_op.default)
                            and node.args[23] is x), node.name
        assert graph.matches.get("chain_block_norms", 0) == sum(
            n.target is chain_op.default and n.args[1] is not None for n in nodes)
        declined.update(graph.declined.get("chain_block_norms", {}))
    assert linked > 0
    # each up block's first block reads the upsampler's output (or conv_in's path): said, not linked
    assert set(declined) == {"the block input is not a block output"}, declined


def test_the_pass_leaves_other_levels_alone():
    from rewrite.pipeline import rewrite_graph

    for graph in tiny_wan("wan2.1", torch.bfloat16)[1]:
        rewrite_graph(graph, "lossless")
        assert not any(n.target is chain_op.default for n in graph.graph_module.graph.nodes)
        assert graph.matches.get("chain_block_norms") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["steady", "chunk0"])
@pytest.mark.parametrize("c,h,w", [(96, 4, 296), (96, 5, 832), (192, 4, 640)])  # rows TMA can store
def test_gpu_chain_producer_on_the_wan_shape_class(monkeypatch, mode, c, h, w):
    """The chosen tiles of the linked shape classes (96 = 64 + 32, 256-pixel programs or two rows of 64; 192 =
    128 + 64, its fused epilogue enabled here though not chosen), with the residual read and the block output
    stored by TMA: as the CPU test."""
    monkeypatch.setattr(wan_fast, "_RESIDUAL_NORM_EPILOGUE_FASTER", frozenset({(c, c)}))
    calls = _pair_fused(monkeypatch)
    args, nxt, (out, next_cache, next_cache2, padded3, next_cache3) = _producer(mode, c=c, h=h, w=w)
    assert len(calls) == 2 and calls[1] is not None, "the second conv's fused epilogue did not run"
    expected = pair_op(*args)
    assert all(torch.equal(a, e) for a, e in zip((out, next_cache, next_cache2), expected))
    _check_next_input(out, nxt, padded3, next_cache3)
