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
"""

from __future__ import annotations

import collections
from typing import Callable, Hashable, Sequence

import torch
from torch import Tensor


class StaticStep:
    """One captured step: `replay()` runs `fn(*inputs)` on the captured buffers and returns its outputs."""

    def __init__(self, fn: Callable[..., Sequence[Tensor]], inputs: Sequence[Tensor], pool=None, warmup: int = 1):
        self.inputs = list(inputs)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
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
            del self._entries[key]
            entry = None
        if entry is None:
            while len(self._entries) >= self.max_entries:
                self._entries.popitem(last=False)
            entry = (pointers, build())
            self._entries[key] = entry
            self.captures += 1
        self._entries.move_to_end(key)
        return entry[1]

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
