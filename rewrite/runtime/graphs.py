"""CUDA graphs of step functions over static buffers, keyed by shape, with a bounded cache.

A `StaticStep` captures `step(*static_inputs)` once (after an eager warm-up on a side stream, so that lazy
initialisation, Triton compilation and cuDNN heuristics happen outside the capture) and replays it. The
step itself writes the state it carries into its own static input buffers at the end of the captured work
(`copy_`), so a replay advances the state; outputs are the graph's own tensors and are overwritten by the
next replay: callers copy what they keep. Replays run exactly the kernels the eager call ran, on the same
shapes, so results are bit-identical to the uncaptured graph modules.

`GraphCache` keeps the step graphs of at most `max_entries` shapes (least recently used evicted, its
memory returned), and drops an entry whose weights are no longer the tensors captured (e.g. after
`load_state_dict(assign=True)` or `.to()`); in-place weight updates are seen by replays.

`GraphPool` keeps steps that share one private memory pool (captured by a backend such as
`CudaGraphBackend`): never evicted one by one, only retired together. A deep copy of a pool is empty
(CUDA graphs cannot be copied, and a pool is never shared by two owners).
"""

from __future__ import annotations

import collections
import contextlib
import copy
from typing import Callable, Hashable, Sequence

import torch
from torch import Tensor

from rewrite.runtime.locks import CAPTURE_GATE


_CAPTURE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


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


def _finish_pending_replays() -> None:
    """Wait for every queued replay before graphs are dropped: their memory goes back to the allocator, which
    may hand it to work on another stream at once."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StaticStep:
    """One captured step: `replay()` runs `fn(*inputs)` on the captured buffers and returns its outputs."""

    def __init__(self, fn: Callable[..., Sequence[Tensor]], inputs: Sequence[Tensor], pool=None, warmup: int = 1):
        self.inputs = list(inputs)
        # Alone among rewrite's work (`rewrite.runtime.locks`); "thread_local": work of other threads in the
        # process may go on (on other streams) without invalidating the capture.
        with CAPTURE_GATE.capturing(), torch.cuda.device(self.inputs[0].device):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    fn(*self.inputs)
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool, stream=_capture_stream(self.inputs[0].device),
                                  capture_error_mode="thread_local"):
                self.outputs = list(fn(*self.inputs))

    def replay(self) -> list[Tensor]:
        self.graph.replay()
        return self.outputs


class GraphCache:
    """Graph sets per key (e.g. (batch, height, width, dtype)), least recently used evicted first."""

    def __init__(self, max_entries: int = 4):
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[Hashable, tuple[tuple[int, ...], object]] = collections.OrderedDict()
        self.captures = 0

    def get(self, key: Hashable, weights: Sequence[Tensor | None], build: Callable[[], object]):
        """The entry for `key`, built (captured) when absent or when the weights moved."""
        pointers = tuple(0 if w is None else w.data_ptr() for w in weights)
        entry = self._entries.get(key)
        if entry is not None and entry[0] != pointers:
            _finish_pending_replays()
            del self._entries[key]
            entry = None
        if entry is None:
            if len(self._entries) >= self.max_entries:
                _finish_pending_replays()
            while len(self._entries) >= self.max_entries:
                self._entries.popitem(last=False)
            entry = (pointers, build())
            self._entries[key] = entry
            self.captures += 1
        self._entries.move_to_end(key)
        return entry[1]

    def clear(self) -> None:
        if self._entries:
            _finish_pending_replays()
        self._entries.clear()

    def __deepcopy__(self, memo: dict) -> "GraphCache":
        """An empty cache: CUDA graphs cannot be copied, and a copied model captures its own."""
        return GraphCache(self.max_entries)

    def __len__(self) -> int:
        return len(self._entries)


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


class GraphPool:
    """Captured steps keyed by shape that share one private memory pool, dropped together.

    Graphs captured into one pool may reuse each other's freed intermediates, so they must never run
    concurrently (they replay one at a time on the current stream) and a single graph must never be
    released while others of the pool stay alive (it would leave survivors pointing at memory, such as a
    cuBLAS workspace, that the pool can hand out again). Hence no per-entry eviction: `retire()` drops
    every graph and the pool with them, and the next capture starts a new generation. With `max_entries`,
    capturing one more graph when the pool is full retires the whole generation first.
    """

    def __init__(self, backend=None, max_entries: int | None = None):
        self.backend = backend if backend is not None else CudaGraphBackend()
        self.max_entries = max_entries
        self.steps: dict[Hashable, object] = {}
        self._pool = None
        self.generation = 0
        self.captures = 0

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
            with static_buffer_mode():
                static = inputs()
            step = self.backend.capture(make_fn(), static, self._pool)
            self.steps[key] = step
            self.captures += 1
        return step

    def __deepcopy__(self, memo: dict) -> "GraphPool":
        """An empty pool on a copy of the backend: the copy of a model captures graphs of its own weights."""
        return GraphPool(copy.deepcopy(self.backend, memo), self.max_entries)

    def retire(self) -> None:
        """Drop every graph of this generation and its pool."""
        if self.steps or self._pool is not None:
            _finish_pending_replays()
            self.generation += 1
        self.steps = {}
        self._pool = None

    def __contains__(self, key: Hashable) -> bool:
        return key in self.steps

    def __len__(self) -> int:
        return len(self.steps)
