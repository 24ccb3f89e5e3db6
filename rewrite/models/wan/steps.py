"""The two ways a Wan-family module runs its chunk-0 and steady step graphs, for the decoder and the encoder:
`EagerSteps` (the graph modules called in turn, caches handed from step to step: CPU, or after a failed CUDA-graph
capture) and `CudaGraphSteps` (CUDA graphs of one size over static buffers, in a module's `GraphMemory`), and
`steady_in_place`, the steady graph that writes its new caches early (`rewrite.models.wan.cache_writes`), and
`chunk0_output_only`, chunk 0 without its caches (single-frame calls).

Exactness: both run the same graphs on the same values as the uncaptured loop (`torch.equal`); only where the
values live changes. Preconditions: graphs as `rewrite.models.wan.capture` and `.encoder_capture` export them,
``chunk0(weights, x) -> (y, *caches)`` and ``steady(weights, x, *caches) -> (y, *caches)``.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from rewrite.models.wan.cache_writes import static_cache_formats, write_caches_in_place
from rewrite.models.wan.conv_weights import ChannelsLastWeights, channels_last_weight_slots
from rewrite.runtime.graph_memory import CacheArena
from rewrite.runtime.graphs import static_buffer_mode

#: the last part of the graph-memory key of steps captured for single-frame calls (chunk 0 alone)
ONE_FRAME = "one frame"


class EagerSteps:
    """The chunk-0 and steady graph modules run eagerly, the caches handed from one step to the next."""

    def __init__(self, chunk0, steady, weights0, weights):
        self.chunk0, self.steady, self.weights0, self.weights = chunk0, steady, weights0, weights
        self.caches: list[torch.Tensor] = []

    def first(self, x: torch.Tensor) -> torch.Tensor:
        y, *self.caches = self.chunk0(self.weights0, x)
        return y

    def next(self, x: torch.Tensor) -> torch.Tensor:
        y, *self.caches = self.steady(self.weights, x, *self.caches)
        return y


class CudaGraphSteps:
    """The chunk-0 and steady graphs of one shape, over static input buffers and static caches.

    Serves the decoder's steps (one latent frame each) and the encoder's (`rewrite.models.wan.encode`: chunk 0
    takes one frame, the steady step four, so `next_example` gives its input a buffer of its own).

    Each captured step copies its new caches into the static cache buffers (after every read of the old
    ones: a T=1 stage's new cache holds its old last frame), so consecutive replays advance the decode exactly
    as the uncaptured loop does. The steady graph does it inside, each cache as soon as the old one is dead
    (`rewrite.models.wan.cache_writes`: the new caches are not all alive at once, which set the peak memory);
    chunk 0 copies at its end. The graphs of every size of the module share one memory pool and their static
    caches are views into one block (`rewrite.runtime.graph_memory`: they never run concurrently).

    The conv weights that channels-last ops read are passed as channels-last copies from `layout_store`
    (`rewrite.models.wan.conv_weights`), refreshed from the live weights at the start of chunk 0, i.e. once per
    decode instead of once per op call in every step.

    The static caches are shared by every call of every size, so they hold one clip at a time: a plain decode
    runs its whole clip in one hold of the runner's lock, but a streamed clip (`rewrite.models.wan.stream`)
    pauses between calls with its state left here (`hold`: the cache block's occupant); whoever uses the
    caches next calls `release()` first, which hands the clip a copy of them (`first` does it itself: chunk 0
    overwrites every cache, and so does a capture).

    `steady=None` captures chunk 0 alone, for single-frame decodes (an image): no static caches, chunk 0 without
    the caches it would return (`chunk0_output_only`: computed and alive together at its end, they held about
    twice diffusers' 1-frame caches) and no steady step, whose working set (four output frames per latent frame
    against chunk 0's one) would otherwise set the pool's size; `next` is refused.
    """

    def __init__(self, chunk0, steady, weights0, weights, x_example: torch.Tensor,
                 layout_store: ChannelsLastWeights, backend, pool, arena: CacheArena,
                 next_example: torch.Tensor | None = None):
        self.arena = arena  # the static caches are views into its block, shared with the module's other sizes
        self.caches: list[torch.Tensor] = []
        if steady is None:  # a single frame: the caches chunk 0 would return are never read
            chunk0 = chunk0_output_only(chunk0)
        weights0, pairs0 = layout_store.substitute(channels_last_weight_slots(chunk0.graph_module), weights0)
        pairs = []
        if steady is not None:
            weights, pairs = layout_store.substitute(channels_last_weight_slots(steady.graph_module), weights)
        refresh_pairs = layout_store.distinct(pairs0 + pairs)
        if steady is not None:
            arena.release()  # the warm-up below writes the shared buffers' memory
        with static_buffer_mode():
            self.x = torch.zeros(x_example.shape, dtype=x_example.dtype, device=x_example.device)
            self.x_next = self.x if next_example is None else torch.zeros_like(next_example)
            if steady is not None:
                _, *caches = chunk0(weights0, self.x)  # eager: cache shapes, and the first warm-up
                formats = static_cache_formats(steady.graph_module, steady.user_input_names)
                self.caches = arena.buffers(caches, formats)
                del _, caches  # not kept alive through the captures below (they would count twice in the peak)

        def first(x):
            layout_store.refresh(refresh_pairs)
            y, *new = chunk0(weights0, x)
            for static, value in zip(self.caches, new):
                static.copy_(value)
            return [y]

        self._first = backend.capture(first, [self.x], pool)
        self._next = None
        if steady is None:
            return

        step_in_place, late = steady_in_place(steady)

        def following(x, *caches):
            y, *new = step_in_place(weights, x, *caches)  # writes the other caches itself
            for index, value in zip(late, new):
                caches[index].copy_(value)
            return [y]

        self._next = backend.capture(following, [self.x_next, *self.caches], pool)

    def release(self) -> None:
        """Give the paused clip whose state the shared static caches hold (if any, and alive; its steps may be
        another size's) its copy of them. Steps of chunk 0 alone write no shared buffer: nothing to do."""
        if self._next is not None:
            self.arena.release()

    def hold(self, state) -> None:
        """`state`, a paused streamed clip, stays in these steps' static caches until someone else needs them."""
        self.arena.hold(state, self.caches)

    def own_bytes(self) -> int:
        """Bytes of the static buffers outside the shared cache block (the latent frame; caches that did not fit)."""
        block = self.arena.block
        shared = None if block is None else block.untyped_storage().data_ptr()
        inputs = self.x.nbytes + (self.x_next.nbytes if self.x_next is not self.x else 0)
        return inputs + sum(c.nbytes for c in self.caches if c.untyped_storage().data_ptr() != shared)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        self.release()
        self.x.copy_(x)
        return self._first.replay()[0]

    def next(self, x: torch.Tensor) -> torch.Tensor:
        if self._next is None:
            raise RuntimeError("these CUDA graphs were captured for single-frame decodes: chunk 0 alone")
        self.x_next.copy_(x)
        return self._next.replay()[0]


def steady_in_place(steady):
    """`steady` with its new caches written into its cache inputs early (`write_caches_in_place`), and the
    indices of the caches it still returns; built once per steady graph and kept on it (`_kept`: the capture and
    the compile-ahead pass run the same step, so the pass's peak memory is the capture's)."""
    def build():
        module, late = write_caches_in_place(steady.graph_module, steady.user_input_names)
        return _with_module(steady, module), late

    return _kept(steady, "in_place", build)


def chunk0_output_only(chunk0):
    """`chunk0` returning ``[y]`` alone: a copy of its graph whose output drops the caches, dead code removed (the
    cache copies, the zero frames of the steady form; an op's unused cache output is freed as it returns). The
    same `y`: only nodes no output depends on go. Built once per graph and kept on it (`_kept`)."""
    def build():
        module = copy.deepcopy(chunk0.graph_module)
        output = next(n for n in module.graph.nodes if n.op == "output")
        output.args = ([output.args[0][0]],)
        module.graph.eliminate_dead_code()
        module.recompile()
        return _with_module(chunk0, module)

    return _kept(chunk0, "output_only", build)


def _kept(graph, name: str, build):
    """`build()`'s result, computed once per captured graph and kept on it (`CapturedGraph.derived`, which lives and
    dies with the graph)."""
    built = graph.derived.get(name)
    if built is None:
        built = graph.derived[name] = build()
    return built


def _with_module(graph, module):
    """`graph` (a `CapturedGraph`) running `module` instead: nothing derived, no weight binding carried over."""
    return dataclasses.replace(graph, graph_module=module, derived={}, _binding=None)
