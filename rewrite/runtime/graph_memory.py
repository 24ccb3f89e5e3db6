"""One module's CUDA-graph memory: the graphs of every size it decodes share one private memory pool and one
block of static cache buffers per device, captured largest first, within an optional byte budget.

What a size's graphs hold is mostly two things: the intermediates of its captured steps (in the private pool
the captures allocate from) and the causal convs' caches carried from one step to the next (static buffers
outside the pool). Kept apart per size, both add up over sizes (issue 37: five sizes at two levels held
51 GiB). Shared, they cost about what the largest size costs alone:

* **One pool.** A module's calls run one at a time (the runner's lock), every graph output is copied out before
  the next replay, and the state carried between replays lives outside the pool: every block of the pool is
  scratch to whichever graph runs, so a later capture may reuse what an earlier one freed (the way LLM servers
  share one pool among their decode graphs). Dropping one size's graphs frees only its outputs, which stay in
  the pool for the next capture; the pool itself goes when the generation retires.
* **One cache block** (`CacheArena`): each size's static caches are views into one block sized by the first
  (largest) size of the generation, so they overlap. Whoever runs next first hands a streamed clip paused in
  them its copy (`CacheArena.release`), as the caches of one size always did.
* **Largest first.** Both only reach their bound if the largest size is captured first (a larger capture cannot
  reuse a smaller one's blocks). A size larger than every size held (by `rank`: the bytes its caches take grow
  with batch x height x width x element size) retires the generation and is captured first into a new one;
  the smaller sizes are captured again, into its memory, on their next decode. A process that meets sizes in
  growing order captures once more per new largest size; `warmup` captures its sizes largest first.
* **Budget** (`budget` bytes, the `graph_memory_budget` option): after each capture, a generation holding more
  than the budget keeps only the size just captured (captured again alone into a fresh pool; the others are
  freed); a size that alone holds more than the budget keeps no CUDA graphs and `get` returns None for it (the
  caller runs its steps without CUDA graphs, which hold nothing between calls). What a pool holds is its
  graphs' whole working set, reserved (more than `memory_allocated()` shows: docs/design.md section 8.4).

`report()` shows what each size's capture added to the pool, its caches, and the total held
(`GraphMemoryReport`). The pool's bytes are read from the allocator's snapshot of the pool's segments
(`CudaGraphBackend.pool_bytes`).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import logging
import weakref
from typing import Callable, Hashable, Protocol, Sequence

import torch
from torch import Tensor

from rewrite.ops import run_context
from rewrite.runtime.graphs import BuildTiming, describe_key, finish_pending_replays, measured_pool_bytes, timed_build

logger = logging.getLogger("rewrite")

#: alignment of each cache view in the shared block (bytes): what a fresh allocation would have
ALIGNMENT = 512


def budget_option(value) -> int | None:
    """`optimize(..., graph_memory_budget=)`: None (no bound) or a number of bytes."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"optimize: graph_memory_budget must be a number of bytes (an int, e.g. 24 * 2**30) or None; "
                        f"got {value!r}")
    if value < 0:
        raise ValueError(f"optimize: graph_memory_budget must be >= 0 bytes; got {value}")
    return value


class HeldGraphs(Protocol):
    """What `GraphMemory` keeps per size (e.g. `rewrite.models.wan.steps.CudaGraphSteps`)."""

    def own_bytes(self) -> int:
        """Bytes of its static buffers outside the shared pool and the shared cache block."""


@dataclasses.dataclass(frozen=True)
class SizeMemory:
    """One held size: what its capture added to the shared pool and the bytes of its caches (views into the
    shared block, so sizes overlap there) and of its other static buffers; `routes`: the convs its capture ran by
    a route of another error class (Winograd: `rewrite.ops.run_context.note_route`)."""

    size: str
    pool_growth: int
    caches: int
    own: int
    routes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class GraphMemoryReport:
    """The CUDA-graph memory a module holds: `total` (pools + cache blocks + the sizes' own buffers), each
    held size, the budget, and how many times a generation was retired (`retired`: a larger size, the
    budget) and recaptured."""

    total: int
    pools: int
    cache_blocks: int
    sizes: tuple[SizeMemory, ...]
    budget: int | None
    retired: dict[str, int]
    over_budget: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        gib = 2**30
        head = (f"CUDA graph memory: {self.total / gib:.2f} GiB held (pools {self.pools / gib:.2f}, cache blocks "
                f"{self.cache_blocks / gib:.2f})" + ("" if self.budget is None else
                                                      f", budget {self.budget / gib:.2f} GiB"))
        lines = [head]
        for size in self.sizes:
            caches = f", caches {size.caches / gib:.2f} GiB (shared block)" if size.caches else ""
            lines.append(f"  {size.size}: pool +{size.pool_growth / gib:.2f} GiB at its capture{caches}, own "
                         f"{size.own / gib:.3f} GiB")
            lines += [f"    {route}" for route in size.routes]
        lines += [f"  retired x{count}: {reason}" for reason, count in sorted(self.retired.items())]
        lines += [f"  over the budget, no CUDA graphs: {size}" for size in self.over_budget]
        return lines


class CacheArena:
    """The static cache buffers of one generation: views into one block, which the first size to ask sizes.

    A size whose caches do not fit the block (it cannot happen when sizes come largest first, but a dtype mix
    may rank them differently) gets buffers of its own. `occupant` is the streamed clip whose state the
    buffers hold between its calls (a weak reference to its `ClipState`, and the steps whose views it is in);
    `release` hands it a copy before anyone else writes them."""

    def __init__(self) -> None:
        self.block: Tensor | None = None
        self.occupant: tuple[weakref.ref, object] | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.block is None else self.block.numel()

    def buffers(self, examples: Sequence[Tensor], formats: Sequence[torch.memory_format | None]) -> list[Tensor]:
        """Static buffers shaped, typed and laid out as `examples` (in `formats`), holding their values: views
        into the block where they fit, else tensors of their own."""
        layouts = [torch.empty(e.shape, dtype=e.dtype, device="meta", memory_format=f or torch.contiguous_format)
                   for e, f in zip(examples, formats)]
        offsets, end = [], 0
        for t in layouts:
            offsets.append(end)
            end += -(-_extent_bytes(t) // ALIGNMENT) * ALIGNMENT
        device = examples[0].device if examples else None
        if self.block is None and examples:
            self.block = torch.empty(end, dtype=torch.uint8, device=device)
        if self.block is None or end > self.block.numel() or self.block.device != device:
            return [e.clone(memory_format=f or torch.preserve_format) for e, f in zip(examples, formats)]
        views = []
        for example, layout, offset in zip(examples, layouts, offsets):
            flat = self.block[offset: offset + _extent_bytes(layout)].view(example.dtype)
            view = flat.as_strided(example.shape, layout.stride())
            view.copy_(example)
            views.append(view)
        return views

    def hold(self, state, caches: list[Tensor]) -> None:
        """`state` (a paused streamed clip) is in `caches`, one size's views of the buffers."""
        self.occupant = (weakref.ref(state), caches)

    def release(self) -> None:
        """Give the paused clip whose state the buffers hold (if any, and alive) its copy of them. The clip stays
        the occupant until its copy is made (a copy that runs out of memory loses nothing)."""
        if self.occupant is not None:
            state = self.occupant[0]()
            if state is not None:
                state.save(self.occupant[1])
        self.occupant = None


def _extent_bytes(t: Tensor) -> int:
    """Bytes from a dense tensor's first element to past its last."""
    return (1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))) * t.element_size() if t.numel() else 0


@dataclasses.dataclass
class _Held:
    pointers: tuple[int, ...]
    graphs: HeldGraphs
    rank: int
    pool_growth: int
    caches: int
    routes: tuple[str, ...]


class _Generation:
    """One device's pool, cache block and the sizes captured into them."""

    def __init__(self, backend, device: torch.device) -> None:
        self.device = device
        self.pool = backend.new_pool()
        self.arena = CacheArena()
        self.held: collections.OrderedDict[Hashable, _Held] = collections.OrderedDict()


class GraphMemory:
    """Graph sets per key (a size: batch, height, width, dtype, device) sharing one pool and cache block per
    device (module docstring). `build(pool, arena)` captures a key's graphs; `get` returns them, or None
    for a key over the budget."""

    def __init__(self, backend, budget: int | None = None, max_entries: int = 8,
                 on_build: Callable[[BuildTiming], None] | None = None) -> None:
        self.backend = backend
        self.budget = budget
        self.max_entries = max_entries
        self.on_build = on_build  # called with the timing of every build
        self._generations: dict[torch.device, _Generation] = {}
        self.over_budget: set[Hashable] = set()
        self.retired: collections.Counter[str] = collections.Counter()
        self.captures = 0

    def get(self, key: Hashable, device: torch.device, rank: int, weights: Sequence[Tensor | None],
            build: Callable[[object, CacheArena], HeldGraphs]) -> HeldGraphs | None:
        """The graphs of `key` on `device`, captured when absent or when the weights moved; None where the
        key alone holds more than the budget. `rank` orders sizes by the memory they take (largest first)."""
        pointers = tuple(0 if w is None else w.data_ptr() for w in weights)
        generation = self._generations.get(device)
        held = generation.held.get(key) if generation is not None else None
        if held is not None and held.pointers != pointers:
            self._drop(generation, key)
            held = None
        if held is not None:
            generation.held.move_to_end(key)
            return held.graphs
        if key in self.over_budget:
            return None
        if generation is not None and not generation.held:
            self.retire(device, "empty")  # a fresh pool and block, sized by this size (nothing held is lost)
        elif generation is not None and rank > max(h.rank for h in generation.held.values()):
            self.retire(device, "a larger size came: the sizes are captured again, largest first")
        generation = self._capture(key, device, rank, pointers, build)
        if self.budget is not None and self.held_bytes(device) > self.budget and len(generation.held) > 1:
            self.retire(device, "over the budget: the other sizes were retired")
            generation = self._capture(key, device, rank, pointers, build)
        if self.budget is not None and self.held_bytes(device) > self.budget:
            self.retire(device, "a size alone over the budget")
            self.over_budget.add(key)
            logger.warning("CUDA graphs of %s hold more than the graph memory budget (%.2f GiB): that size runs "
                           "without CUDA graphs", describe_key(key), self.budget / 2**30)
            return None
        return generation.held[key].graphs

    def _capture(self, key: Hashable, device: torch.device, rank: int, pointers: tuple[int, ...],
                 build: Callable[[object, CacheArena], HeldGraphs]) -> _Generation:
        generation = self._generations.get(device)
        if generation is None:
            generation = self._generations[device] = _Generation(self.backend, device)
        while len(generation.held) >= self.max_entries:
            self._drop(generation, next(iter(generation.held)))
        before, arena_before = self._pool_bytes(generation), generation.arena.nbytes
        routes: set[str] = set()
        with timed_build(key) as timing, run_context.using(routes=routes):
            graphs = build(generation.pool, generation.arena)
        growth = self._pool_bytes(generation) - before
        caches = sum(c.numel() * c.element_size() for c in getattr(graphs, "caches", ()))
        generation.held[key] = _Held(pointers, graphs, rank, growth, caches, tuple(sorted(routes)))
        self.captures += 1
        if generation.arena.nbytes != arena_before:
            logger.debug("graph memory: %s opened a cache block of %.2f GiB", describe_key(key),
                         generation.arena.nbytes / 2**30)
        if self.on_build is not None:
            self.on_build(timing)
        return generation

    def _drop(self, generation: _Generation, key: Hashable) -> None:
        """One size's graphs go (their memory stays in the pool for the next capture)."""
        finish_pending_replays()
        held = generation.held.pop(key)
        if generation.arena.occupant is not None and generation.arena.occupant[1] is held.graphs.caches:
            generation.arena.release()

    def retire(self, device: torch.device, reason: str) -> None:
        """Drop every size of `device`'s generation, its pool and its cache block (a paused streamed clip gets
        its copy of the caches first)."""
        generation = self._generations.pop(device, None)
        if generation is None:
            return
        finish_pending_replays()
        if generation.held:
            self.retired[reason] += 1
        generation.held.clear()  # the graphs go first: the paused clip's copy may need their memory
        generation.arena.release()

    def clear(self) -> None:
        """Drop every generation; the budget verdicts go too (a new budget or new weights may fit)."""
        for device in list(self._generations):
            self.retire(device, "cleared")
        self.retired.pop("cleared", None)
        self.over_budget.clear()

    def held_bytes(self, device: torch.device | None = None) -> int:
        """Bytes held by the generations (of `device`, or all): pools, cache blocks, the sizes' own buffers."""
        return sum(self._pool_bytes(g) + g.arena.nbytes + sum(h.graphs.own_bytes() for h in g.held.values())
                   for d, g in self._generations.items() if device is None or d == device)

    def _pool_bytes(self, generation: _Generation) -> int:
        return measured_pool_bytes(self.backend, generation.pool)

    def report(self) -> GraphMemoryReport:
        sizes = tuple(SizeMemory(describe_key(key), h.pool_growth, h.caches, h.graphs.own_bytes(), h.routes)
                      for g in self._generations.values() for key, h in g.held.items())
        return GraphMemoryReport(
            total=self.held_bytes(),
            pools=sum(self._pool_bytes(g) for g in self._generations.values()),
            cache_blocks=sum(g.arena.nbytes for g in self._generations.values()),
            sizes=sizes, budget=self.budget, retired=dict(self.retired),
            over_budget=tuple(describe_key(k) for k in self.over_budget))

    def entries(self) -> list[HeldGraphs]:
        """The graphs held, every device's generation, least recently used first."""
        return [h.graphs for g in self._generations.values() for h in g.held.values()]

    def __contains__(self, key: Hashable) -> bool:
        return any(key in g.held for g in self._generations.values())

    def __len__(self) -> int:
        return sum(len(g.held) for g in self._generations.values())

    def __deepcopy__(self, memo: dict) -> "GraphMemory":
        """Empty: CUDA graphs cannot be copied, and a copied model captures its own."""
        return GraphMemory(copy.deepcopy(self.backend, memo), self.budget, self.max_entries,
                           copy.deepcopy(self.on_build, memo))
