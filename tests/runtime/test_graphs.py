"""CUDA-graph containers on CPU: what a deep copy of a model's runner gets, pool generations, and what a
graph build is charged (its own thread's self-checks and kernel launches only)."""

from __future__ import annotations

import copy
import threading
import time

import torch

from rewrite.runtime.graph_memory import GraphMemory
from rewrite.runtime.graphs import GraphPool, static_buffer_mode
from rewrite.ops import compile_ahead, selftest
from tests.graph_fakes import FakeGraphs, Uncopyable
from tests.ops.test_compile_ahead import FakeKernel


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


class SlowChecksAndLaunches:
    """A graph backend whose "capture" runs a self-check and a kernel launch of 50 ms each in the building thread."""

    def new_pool(self):
        return object()

    def capture(self, fn, inputs, pool):
        selftest._timed("frame_conv", lambda: time.sleep(0.05) or True)
        compile_ahead.launch(SleepingKernel(), (1,))
        return fn


class SleepingKernel(FakeKernel):
    def __getitem__(self, grid):
        return lambda *args, **kwargs: time.sleep(0.05)


def test_a_build_is_charged_its_own_thread_s_self_checks_and_launches_only():
    timings, stop = [], threading.Event()

    def other_thread():  # self-checks of another thread at the same time are not this build's
        while not stop.is_set():
            selftest._timed("silu", lambda: time.sleep(0.005) or True)

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        pool = GraphPool(SlowChecksAndLaunches(), on_build=timings.append)
        pool.get(("a", 1), lambda: (lambda x: [x]), lambda: [torch.zeros(1)])
        pool.get(("a", 1), lambda: (lambda x: [x]), lambda: [torch.zeros(1)])  # built once
    finally:
        stop.set()
        thread.join()
    (timing,) = timings
    # the other thread checked all along (>= 0.1 s during the build): charged to the build, it would show here
    assert 0.05 <= timing.self_checks < 0.09 and 0.05 <= timing.kernel_launches < 0.09
    assert timing.seconds >= timing.self_checks + timing.kernel_launches
    assert timing.label == "CUDA graphs 1 a" and all(v >= 0 for v in timing.stages().values())
