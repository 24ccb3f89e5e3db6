"""CUDA-graph containers on CPU: what a deep copy of a model's runner gets, and pool generations."""

from __future__ import annotations

import copy

import torch

from rewrite.runtime.graph_memory import GraphMemory
from rewrite.runtime.graphs import GraphPool, static_buffer_mode
from tests.graph_fakes import FakeGraphs, Uncopyable


def test_deep_copies_of_graph_containers_are_empty():
    memory = GraphMemory(FakeGraphs(), budget=1 << 30, max_entries=2)
    held = Uncopyable()
    held.own_bytes = lambda: 0
    memory.get("a", torch.device("cpu"), 1, [torch.zeros(2)], lambda pool, arena: held)
    twin = copy.deepcopy(memory)
    assert len(memory) == 1 and len(twin) == 0 and (twin.max_entries, twin.budget) == (2, 1 << 30)

    pool = GraphPool(FakeGraphs(cuda_like=True), max_entries=3)  # its steps refuse deepcopy
    pool.get("a", lambda: (lambda x: [x]), lambda: [torch.zeros(1)])
    twin_pool = copy.deepcopy(pool)
    assert len(pool) == 1 and len(twin_pool) == 0 and twin_pool.max_entries == 3


def test_a_full_pool_retires_its_whole_generation():
    backend = FakeGraphs()
    pool = GraphPool(backend, max_entries=2)
    for key in ("a", "b", "c"):
        pool.get(key, lambda: (lambda x: [x]), lambda: [torch.zeros(1)])
    assert set(pool.steps) == {"c"} and pool.generation == 1 and backend.pools == 2
    pool.retire()
    assert len(pool) == 0 and pool.generation == 2


def test_static_buffers_are_made_without_inference_or_grad_mode():
    """`torch.inference_mode(False)` alone turns grad mode on: a warm-up there would record autograd state
    and keep every intermediate alive (this raised the Wan lossless peak from 5.7 to 7.2 GiB on the H200)."""
    weight = torch.nn.Parameter(torch.ones(3))
    for outer in (torch.inference_mode, torch.no_grad):
        with outer(), static_buffer_mode():
            buffer = torch.zeros(3)
            product = weight * buffer
            assert not torch.is_inference_mode_enabled() and not buffer.is_inference()
            assert not torch.is_grad_enabled() and product.grad_fn is None
