"""Stand-ins for CUDA-graph capture on the CPU, shared by the runtime tests.

A runner's graph backend offers ``can_capture(device)``, ``new_pool()``, ``capture(fn, inputs, pool)`` and
``pool_bytes(pool)`` (`rewrite.runtime.graphs.CudaGraphBackend`). `FakeGraphs` "captures" by keeping `fn` and
its static inputs and replays it eagerly into static outputs that the next replay overwrites, as a CUDA graph
does, so the runtime's bookkeeping (graph keys, pools, static buffers, retirement, deep copies) runs without
CUDA. Its pools hold, as a shared CUDA-graph pool ideally does, the largest footprint captured into them
(`footprint(inputs)`: by default 100 times the first input's bytes).
"""

from __future__ import annotations

import torch


class Uncopyable:
    """Stands for the `torch.cuda.CUDAGraph` a real step holds: a pybind object that deepcopy and pickle refuse."""

    def __reduce_ex__(self, protocol):
        raise TypeError("cannot pickle 'torch._C._CUDAGraph' object")


class FakeStep:
    """A captured step replayed eagerly: `fn` over the static `inputs`, its results copied into the outputs of
    the first replay (the same tensors every time)."""

    def __init__(self, fn, inputs):
        self.fn, self.inputs, self.outputs = fn, list(inputs), None

    def replay(self):
        results = self.fn(*self.inputs)
        if self.outputs is None:
            # A real replay writes its outputs' memory directly: no inference-mode check ever sees it.
            with torch.inference_mode(False):
                self.outputs = [r.clone() for r in results]
        else:
            for static, value in zip(self.outputs, results):
                static.copy_(value)
        return self.outputs


class FakeGraphs:
    """A graph backend that captures nothing: records (first input's shape, pool) per capture in `captured`;
    `fail` raises as a capture refused by CUDA does; `cuda_like` gives each step an `Uncopyable` graph."""

    def __init__(self, fail: bool = False, cuda_like: bool = False, footprint=None):
        self.fail, self.cuda_like = fail, cuda_like
        self.footprint = footprint or (lambda inputs: 100 * inputs[0].numel() * inputs[0].element_size())
        self.pools = 0
        self.pool_sizes: dict[int, int] = {}
        self.captured: list[tuple[tuple[int, ...], int]] = []

    def pool_bytes(self, pool):
        return self.pool_sizes.get(pool, 0)

    def can_capture(self, device):
        return True

    def new_pool(self):
        self.pools += 1
        return self.pools

    def capture(self, fn, inputs, pool):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captured.append((tuple(inputs[0].shape), pool))
        self.pool_sizes[pool] = max(self.pool_sizes.get(pool, 0), self.footprint(inputs))
        step = FakeStep(fn, inputs)
        if self.cuda_like:
            step.graph = Uncopyable()
        return step
