"""One module's CUDA-graph memory (`rewrite.runtime.graph_memory`): sizes share one pool and one cache block,
captured largest first, within a byte budget, and the report says what each size holds (issue 37, item 2).

The bookkeeping runs against stand-in graphs (`tests.graph_fakes.FakeGraphs`, whose pools hold the largest
footprint captured into them); the tiny Wan decodes through it are `torch.equal` to the reference.
`tests/runtime/test_full_size_memory.py` measures the real allocator.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rewrite import optimize, report
from rewrite.models.wan.config import build_wan
from rewrite.ops import run_context
from rewrite.runtime.graph_memory import CacheArena, GraphMemory
from rewrite.runtime.runner import installed_runner
from tests.graph_fakes import FakeGraphs

CPU = torch.device("cpu")


class _Graphs:
    """Stands for one size's captured steps: a static buffer of `nbytes` bytes (its caches) from the arena."""

    def __init__(self, pool, arena: CacheArena, backend: FakeGraphs, nbytes: int):
        self.pool = pool
        self.caches = arena.buffers([torch.zeros(nbytes, dtype=torch.uint8)], [None])
        backend.capture(lambda x: [x], [torch.zeros(nbytes, dtype=torch.uint8)], pool)

    def own_bytes(self) -> int:
        return 0


def _memory(budget=None):
    backend = FakeGraphs(footprint=lambda inputs: 10 * inputs[0].numel())
    memory = GraphMemory(backend, budget)

    def get(key: str, nbytes: int):
        return memory.get(key, CPU, nbytes, [], lambda pool, arena: _Graphs(pool, arena, backend, nbytes))
    return memory, backend, get


def test_sizes_share_one_pool_and_one_cache_block_when_the_largest_comes_first():
    memory, backend, get = _memory()
    large, small = get("large", 1000), get("small", 400)
    assert backend.pools == 1 and large.pool == small.pool
    assert small.caches[0].untyped_storage().data_ptr() == large.caches[0].untyped_storage().data_ptr()
    held = memory.report()
    assert held.total == 10 * 1000 + 1024  # the largest footprint and one cache block (aligned), not the sum
    assert [(s.size, s.pool_growth, s.caches) for s in held.sizes] == [("large", 10000, 1000), ("small", 0, 400)]
    assert get("large", 1000) is large and backend.pools == 1  # held: no capture


def test_each_size_reports_the_routes_its_capture_noted_and_nothing_is_noted_outside_a_capture():
    memory = GraphMemory(FakeGraphs(footprint=lambda inputs: 0))

    def build(route):
        def capture(pool, arena):
            if route:
                run_context.note_route(route)
                run_context.note_route(route)  # a route taken twice in one capture is listed once
            return _Graphs(pool, arena, memory.backend, 8)
        return capture
    memory.get("large", CPU, 2, [], build("Winograd conv A"))
    memory.get("small", CPU, 1, [], build(None))
    run_context.note_route("outside any capture")  # no collector: nothing recorded, nothing raised
    assert run_context.current().routes is None
    held = memory.report()
    assert [(s.size, s.routes) for s in held.sizes] == [("large", ("Winograd conv A",)), ("small", ())]
    assert "    Winograd conv A" in held.lines()


def test_a_larger_size_retires_the_generation_and_the_smaller_ones_come_back_into_its_memory():
    memory, backend, get = _memory()
    get("small", 400)
    get("large", 1000)
    assert backend.pools == 2 and memory.report().retired == {
        "a larger size came: the sizes are captured again, largest first": 1}
    assert "small" not in memory
    small = get("small", 400)
    assert small.pool == 2 and memory.held_bytes() == 10 * 1000 + 1024 and memory.captures == 3


def test_the_budget_keeps_only_the_size_just_captured_and_refuses_a_size_alone_over_it():
    memory, backend, get = _memory(budget=10 * 1000 + 1024)
    get("large", 1000)
    get("small", 400)  # shares: within the budget
    assert len(memory) == 2
    memory.budget = 8100
    assert get("large", 1000) is not None  # held: the budget is checked at captures
    assert get("medium", 700) is not None  # 10000 + 1024 > 8100: the others go, captured again alone
    assert len(memory) == 1 and "medium" in memory and memory.held_bytes() == 7000 + 1024
    assert get("large", 1000) is None  # alone over the budget: no CUDA graphs for it, the rest retired
    assert get("large", 1000) is None and memory.held_bytes() == 0
    assert memory.report().over_budget == ("large",)
    memory.clear()
    assert memory.over_budget == set()


def test_moved_weights_recapture_only_their_size():
    backend = FakeGraphs(footprint=lambda inputs: 0)
    memory = GraphMemory(backend)
    weight = torch.zeros(2)
    first = memory.get("a", CPU, 1, [weight], lambda pool, arena: _Graphs(pool, arena, backend, 8))
    other = memory.get("b", CPU, 1, [], lambda pool, arena: _Graphs(pool, arena, backend, 8))
    again = memory.get("a", CPU, 1, [torch.zeros(2)], lambda pool, arena: _Graphs(pool, arena, backend, 8))
    assert again is not first and memory.get("b", CPU, 1, [], None) is other and backend.pools == 1


def test_a_generation_left_empty_starts_afresh_for_the_next_size():
    memory, backend, get = _memory()
    weight = torch.zeros(2)
    memory.get("small", CPU, 400, [weight], lambda pool, arena: _Graphs(pool, arena, backend, 400))
    moved = [torch.zeros(2)]  # the only size's weights moved: it is dropped, its generation left empty
    big = memory.get("small", CPU, 1000, moved, lambda pool, arena: _Graphs(pool, arena, backend, 1000))
    block = memory._generations[CPU].arena.block
    assert backend.pools == 2 and memory.report().retired == {}
    assert big.caches[0].untyped_storage().data_ptr() == block.untyped_storage().data_ptr()
    assert memory.held_bytes() == 10 * 1000 + 1024  # a block sized by it, not the old one plus its own buffers


def test_cache_views_hold_the_example_values_and_a_size_that_does_not_fit_gets_its_own():
    arena = CacheArena()
    examples = [torch.arange(6.0).view(2, 3), torch.arange(8, dtype=torch.bfloat16).view(1, 2, 2, 2)]
    views = arena.buffers(examples, [None, torch.channels_last])
    assert all(torch.equal(v, e) for v, e in zip(views, examples))
    assert views[1].is_contiguous(memory_format=torch.channels_last)
    assert arena.nbytes == 512 + 512
    bigger = arena.buffers([torch.ones(300)], [None])  # 1200 bytes: more than the block
    assert bigger[0].untyped_storage().data_ptr() != arena.block.untyped_storage().data_ptr()


def test_the_block_occupant_gets_its_copy_before_anyone_writes_the_block():
    class Clip:
        saved = None

        def save(self, caches):
            self.saved = [c.clone() for c in caches]

    arena, clip = CacheArena(), Clip()
    arena.hold(clip, [torch.full((4,), 7.0)])
    arena.release()
    assert torch.equal(clip.saved[0], torch.full((4,), 7.0)) and arena.occupant is None


# ---- a tiny Wan decoder through stand-in graphs ------------------------------------------------------------
def _optimized_tiny(**options):
    reference = build_wan("wan2.1", "tiny")
    optimized = optimize(copy.deepcopy(reference), "lossless", **options)
    backend = installed_runner(optimized).graph_backend = FakeGraphs()
    return reference, optimized, backend


def _latents(height: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(1, 4, 3, height, width, generator=torch.Generator().manual_seed(seed))


def test_two_sizes_of_a_wan_module_share_one_pool_and_cache_block_and_decode_exactly():
    reference, optimized, backend = _optimized_tiny()
    with torch.no_grad():
        for height, width, seed in ((6, 8, 0), (4, 6, 1), (6, 8, 2)):
            z = _latents(height, width, seed)
            assert torch.equal(optimized.decode(z).sample, reference.decode(z).sample)
    assert backend.pools == 1 and report(optimized).last_path == "graphs"
    small, large = installed_runner(optimized).cuda_graphs.entries()  # least recently used first
    assert large.x.shape[-2:] == (6, 8) and small.x.shape[-2:] == (4, 6)
    block = large.arena.block.untyped_storage().data_ptr()
    assert all(c.untyped_storage().data_ptr() == block for c in large.caches + small.caches)
    held = report(optimized).graph_memory
    assert [s.size for s in held.sizes] == ["1x4x6 float32 cpu", "1x6x8 float32 cpu"]
    assert held.sizes[1].pool_growth > 0 and held.sizes[0].pool_growth == 0  # the small one fits the large one's
    assert "CUDA graph memory" in str(report(optimized))


def test_a_streamed_clip_paused_in_the_shared_caches_survives_a_decode_of_another_size():
    reference, optimized, _ = _optimized_tiny()
    clip, other = _latents(6, 8, 0), _latents(4, 6, 1)
    with torch.no_grad():
        optimized.decode(clip), optimized.decode(other)  # both sizes captured: the next decodes only replay
        pieces = optimized.decode_stream(clip)
        first = [next(pieces)]  # (first frame index, frames)
        assert torch.equal(optimized.decode(other).sample, reference.decode(other).sample)
        streamed = torch.cat([frames for _, frames in first + list(pieces)], dim=2)
        assert torch.equal(streamed, reference.decode(clip).sample)


def test_single_frame_decodes_capture_chunk_0_alone_until_the_size_has_full_steps():
    reference, optimized, backend = _optimized_tiny()
    image, clip = torch.randn(1, 4, 1, 6, 8), _latents(6, 8, 0)
    with torch.no_grad():
        assert torch.equal(optimized.decode(image).sample, reference.decode(image).sample)
        assert len(backend.captured) == 1  # chunk 0 alone: no steady step, no static caches
        (steps,) = installed_runner(optimized).cuda_graphs.entries()
        assert steps.caches == [] and report(optimized).graph_memory.sizes[0].size == "1x6x8 float32 cpu one frame"
        (chunk0, _), = installed_runner(optimized).graphs.values.values()
        output_only = chunk0.derived["output_only"]  # chunk 0 without its caches (`chunk0_output_only`)
        outputs = next(n for n in output_only.graph_module.graph.nodes if n.op == "output").args[0]
        assert len(outputs) == 1 and output_only.node_count < chunk0.node_count
        with pytest.raises(RuntimeError, match="single-frame"):
            steps.next(image)
        assert torch.equal(optimized.decode(clip).sample, reference.decode(clip).sample)
        assert len(backend.captured) == 3  # the clip's own chunk 0 and steady step
        assert torch.equal(optimized.decode(image).sample, reference.decode(image).sample)
        assert len(backend.captured) == 3  # the size's full steps serve a single frame too
    assert report(optimized).last_path == "graphs"


def test_warmup_of_single_frames_captures_chunk_0_alone():
    reference, optimized, backend = _optimized_tiny()
    vae_runner = installed_runner(optimized)
    with torch.no_grad():
        vae_runner.warmup(CPU, torch.float32, shapes=[(6, 8)], frames=1)
        assert len(backend.captured) == 1
        vae_runner.warmup(CPU, torch.float32, shapes=[(4, 6)], frames=[1, 3])
        assert len(backend.captured) == 3  # chunk 0 and steady


def test_a_budget_below_one_size_decodes_without_cuda_graphs_and_says_so():
    reference, optimized, backend = _optimized_tiny(graph_memory_budget=0)
    z = _latents(4, 6, 0)
    with torch.no_grad():
        assert torch.equal(optimized.decode(z).sample, reference.decode(z).sample)
        assert torch.equal(optimized.decode(z).sample, reference.decode(z).sample)
    held = report(optimized).graph_memory
    assert held.over_budget == ("1x4x6 float32 cpu",) and held.total == 0 and held.budget == 0
    assert len(backend.captured) == 2  # captured once (chunk 0 and steady), then never again


@pytest.mark.parametrize("value,error", [("8GB", TypeError), (1.5, TypeError), (True, TypeError), (-1, ValueError)])
def test_a_bad_budget_is_refused_naming_what_is_expected(value, error):
    vae = build_wan("wan2.1", "tiny")
    with pytest.raises(error, match="graph_memory_budget"):
        optimize(vae, "lossless", graph_memory_budget=value)
    assert installed_runner(vae) is None


def test_auk_reports_the_memory_of_its_bucket_pool_per_shape():
    from rewrite.models.auk.model import AuKConfig, AuKVAE

    micro = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                      resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))
    torch.manual_seed(0)
    backend = FakeGraphs()
    vae = optimize(AuKVAE(micro).eval(), "channels_last", graph_backend=backend, compile_shapes=(64,))
    with torch.no_grad():
        vae.decode(torch.randn(1, 50, 8, generator=torch.Generator().manual_seed(0)))
    held = report(vae).graph_memory
    [size] = held.sizes
    assert size.size == "bucket 1x64 float32 cpu" and size.pool_growth == 100 * 64 * 8 * 4 and size.own == 64 * 8 * 4
    assert held.total == size.pool_growth + size.own and "CUDA graph memory" in str(report(vae))
