"""CUDA graphs of step functions over static buffers, keyed by shape, with a bounded cache.

A `StaticStep` captures `step(*static_inputs)` once (after an eager warm-up on a side stream, so that lazy
initialisation, Triton compilation and cuDNN heuristics happen outside the capture) and replays it. The
step itself writes the state it carries into its own static input buffers at the end of the captured work
(`copy_`), so a replay advances the state; outputs are the graph's own tensors and are overwritten by the
next replay: callers copy what they keep. Replays run exactly the kernels the eager call ran, on the same
shapes, so results are bit-identical to the uncaptured graph modules.

Wan's graph sets per size, sharing one pool and one cache block per module, are kept by
`rewrite.runtime.graph_memory.GraphMemory`.

`GraphPool` keeps steps that share one private memory pool (captured by a backend such as
`CudaGraphBackend`): never evicted one by one, only retired together. A deep copy of a pool is empty
(CUDA graphs cannot be copied, and a pool is never shared by two owners).

What a build costs: the containers time each build (`BuildTiming`: the whole build, the `StaticStep`
warm-ups and captures inside it, and of those the per-shape self-checks and the time inside Triton launches,
read from the calling thread's counters in `rewrite.ops.selftest` and `rewrite.ops.compile_ahead`) and hand it
to their owner's `on_build` callback (the runner reports it and persists new self-check verdicts).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from typing import Callable, Hashable, Iterator, Sequence

import torch
from torch import Tensor

from rewrite.ops import compile_ahead, selftest
from rewrite.runtime.locks import CAPTURE_GATE


_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


@dataclasses.dataclass
class BuildTiming:
    """Seconds of one build of a container entry (the CUDA graphs of one key): `seconds` in all; `warmup` and
    `capture` summed over its `StaticStep`s; `self_checks` and `kernel_launches` spent by the building thread
    anywhere in the build (parts of `seconds`, mostly of the warm-ups); `compile_ahead` inside compile-ahead
    passes of the build (AuK: before its first capture)."""

    key: Hashable
    seconds: float = 0.0
    warmup: float = 0.0
    capture: float = 0.0
    self_checks: float = 0.0
    kernel_launches: float = 0.0
    compile_ahead: float = 0.0
    steps: int = 0

    @property
    def label(self) -> str:
        return "CUDA graphs " + describe_key(self.key)

    def stages(self) -> dict[str, float]:
        """Stage -> seconds as `rewrite.reporting.Timing` names them; "warm-up" is everything of the build that
        is not a capture or a compile-ahead pass (the StaticSteps' eager runs, static buffers, first runs)."""
        other = max(0.0, self.seconds - self.capture - self.compile_ahead)
        stages = {"warm-up": other, "capture": self.capture, "self-checks": self.self_checks,
                  "kernel launches": self.kernel_launches}
        if self.compile_ahead:
            stages["compile ahead"] = self.compile_ahead
        return stages


def describe_key(key: Hashable) -> str:
    """A graph key as the report shows it: ints joined by "x", then dtype and device (``1x60x104 bfloat16 cuda:0``)."""
    parts = key if isinstance(key, tuple) else (key,)
    sizes = "x".join(str(p) for p in parts if isinstance(p, int))
    rest = [str(p).replace("torch.", "") for p in parts if not isinstance(p, int)]
    return " ".join([sizes] * bool(sizes) + rest)


_BUILDING = threading.local()  # .timing: the BuildTiming of the build under way in this thread, if any


@contextlib.contextmanager
def timed_build(key: Hashable) -> Iterator[BuildTiming]:
    """Times the block as the build of `key` (nested `StaticStep`s add their warm-up and capture seconds)."""
    timing, outer = BuildTiming(key), getattr(_BUILDING, "timing", None)
    checks, launches = selftest.thread_seconds(), compile_ahead.thread_launch_seconds()
    ahead, start = compile_ahead.thread_compile_ahead_seconds(), time.perf_counter()
    _BUILDING.timing = timing
    try:
        yield timing
    finally:
        _BUILDING.timing = outer
        timing.seconds = time.perf_counter() - start
        timing.self_checks = selftest.thread_seconds() - checks
        timing.kernel_launches = compile_ahead.thread_launch_seconds() - launches
        timing.compile_ahead = compile_ahead.thread_compile_ahead_seconds() - ahead


@contextlib.contextmanager
def static_buffer_mode():
    """Where static graph buffers are made: outside inference mode (so replays may write them whatever mode
    a later call runs in) and with grad mode off. ``torch.inference_mode(False)`` alone turns grad mode
    *on*, so a warm-up run made there would record autograd state and keep every activation alive."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def _capture_stream(device: torch.device) -> "torch.cuda.Stream":
    """One capture stream per device, reused by every capture on it: a caching-allocator block is reused
    only on the stream it was freed on, so graphs sharing a memory pool must be captured on one stream
    (torch.cuda.graph's own default stream belongs to whichever device was current when it was made)."""
    stream = _CAPTURE_STREAMS.get(device)
    if stream is None:
        stream = _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def finish_pending_replays() -> None:
    """Wait for every queued replay before graphs are dropped: their memory goes back to the allocator, which
    may hand it to work on another stream at once."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StaticStep:
    """One captured step: `replay()` runs `fn(*inputs)` on the captured buffers and returns its outputs."""

    def __init__(self, fn: Callable[..., Sequence[Tensor]], inputs: Sequence[Tensor], pool=None, warmup: int = 1):
        self.inputs = list(inputs)
        # the device of the first CUDA input (a captured step may also read a CPU scalar tensor)
        device = next((t.device for t in self.inputs if isinstance(t, Tensor) and t.is_cuda), None)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        # Alone among rewrite's work (`rewrite.runtime.locks`); "thread_local": work of other threads in the
        # process may go on (on other streams) without invalidating the capture.
        with CAPTURE_GATE.capturing(), torch.cuda.device(device):
            start = time.perf_counter()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    fn(*self.inputs)
            torch.cuda.current_stream().wait_stream(stream)
            captured = time.perf_counter()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool, stream=_capture_stream(device),
                                  capture_error_mode="thread_local"):
                self.outputs = list(fn(*self.inputs))
            done = time.perf_counter()
        #: seconds of the eager warm-up runs and of the capture (host time: the warm-up's queued work is
        #: waited for by the capture's stream, so it counts in the capture)
        self.warmup_seconds, self.capture_seconds = captured - start, done - captured
        timing = getattr(_BUILDING, "timing", None)
        if timing is not None:
            timing.warmup += self.warmup_seconds
            timing.capture += self.capture_seconds
            timing.steps += 1

    def replay(self) -> list[Tensor]:
        self.graph.replay()
        return self.outputs


class CudaGraphBackend:
    """Captures `StaticStep`s into CUDA graph memory pools (the production backend of `GraphPool`)."""

    @staticmethod
    def can_capture(device: torch.device) -> bool:
        return device.type == "cuda"

    @staticmethod
    def new_pool():
        return torch.cuda.graph_pool_handle()

    @staticmethod
    def capture(fn: Callable[..., Sequence[Tensor]], inputs: Sequence[Tensor], pool) -> StaticStep:
        return StaticStep(fn, inputs, pool=pool)

    @staticmethod
    def pool_bytes(pool) -> int:
        """Bytes the allocator holds in the pool's segments (its private memory, free blocks included)."""
        if pool is None or not torch.cuda.is_initialized():
            return 0
        return sum(segment["total_size"] for segment in torch.cuda.memory_snapshot()
                   if tuple(segment.get("segment_pool_id", ())) == tuple(pool))


def measured_pool_bytes(backend, pool) -> int:
    """What `backend` measures the pool to hold (`CudaGraphBackend.pool_bytes`); 0 for no pool, or a stand-in
    backend that does not measure."""
    measure = getattr(backend, "pool_bytes", None)
    return 0 if measure is None or pool is None else measure(pool)


class GraphPool:
    """Captured steps keyed by shape that share one private memory pool, dropped together.

    Graphs captured into one pool may reuse each other's freed intermediates, so they must never run
    concurrently (they replay one at a time on the current stream) and a single graph must never be
    released while others of the pool stay alive (it would leave survivors pointing at memory, such as a
    cuBLAS workspace, that the pool can hand out again). Hence no per-entry eviction: `retire()` drops
    every graph and the pool with them, and the next capture starts a new generation. With `max_entries`,
    capturing one more graph when the pool is full retires the whole generation first.
    """

    def __init__(self, backend=None, max_entries: int | None = None,
                 on_build: Callable[[BuildTiming], None] | None = None):
        self.backend = backend if backend is not None else CudaGraphBackend()
        self.max_entries = max_entries
        self.on_build = on_build  # called with the timing of every capture (see the module docstring)
        self.steps: dict[Hashable, object] = {}
        self._pool = None
        self.generation = 0
        self.captures = 0
        #: per key of this generation: (bytes its capture added to the pool, bytes of its static inputs)
        self.memory: dict[Hashable, tuple[int, int]] = {}

    def get(self, key: Hashable, make_fn: Callable[[], Callable[..., Sequence[Tensor]]],
            inputs: Callable[[], Sequence[Tensor]]):
        """The step for `key`, captured from `make_fn()(*inputs())` when absent (retiring a full generation
        first). Both are factories: nothing is built for a key already captured."""
        step = self.steps.get(key)
        if step is None:
            if self.max_entries is not None and len(self.steps) >= self.max_entries:
                self.retire()
            if self._pool is None:
                self._pool = self.backend.new_pool()
            before = self.pool_bytes()
            with timed_build(key) as timing:
                with static_buffer_mode():
                    static = inputs()
                step = self.backend.capture(make_fn(), static, self._pool)
            self.steps[key] = step
            self.memory[key] = (self.pool_bytes() - before, sum(t.nbytes for t in static))
            self.captures += 1
            if self.on_build is not None:
                self.on_build(timing)
        return step

    def __deepcopy__(self, memo: dict) -> "GraphPool":
        """An empty pool on a copy of the backend: the copy of a model captures graphs of its own weights."""
        return GraphPool(copy.deepcopy(self.backend, memo), self.max_entries, copy.deepcopy(self.on_build, memo))

    def retire(self) -> None:
        """Drop every graph of this generation and its pool."""
        if self.steps or self._pool is not None:
            finish_pending_replays()
            self.generation += 1
        self.steps = {}
        self.memory = {}
        self._pool = None

    def pool_bytes(self) -> int:
        """Bytes the allocator holds in this generation's pool (0 where the backend does not measure)."""
        return measured_pool_bytes(self.backend, self._pool)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.steps

    def __len__(self) -> int:
        return len(self.steps)
