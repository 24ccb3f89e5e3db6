"""GPU memory of optimized full-size Wan decoders: given back when the module goes, and a decode that runs out
of memory on the optimized path still returns the reference result (issue 37, items 1 and 3).

The CPU tests (`tests/runtime/test_memory_release.py`, `tests/runtime/test_out_of_memory.py`) check the
bookkeeping with stand-in graphs; these check the allocator's numbers with real CUDA graphs and a real out-of-memory error.
"""

from __future__ import annotations

import gc

import pytest
import torch

from rewrite import optimize, report
from rewrite.models.wan.config import build_wan

pytestmark = pytest.mark.gpu

#: what `memory_allocated()` may differ from its value before the module was built (issue 37's target)
RETURNED_WITHIN = 64 * 2**20


def _latents(vae, latent_frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    ratio = vae.spatial_compression_ratio
    shape = (1, vae.config.z_dim, latent_frames, height // ratio, width // ratio)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16)


def _collect() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def _reserved() -> int:
    """What the allocator holds after the cache is emptied: allocated blocks, and every segment of a private
    pool in use (a CUDA-graph pool keeps its free blocks for its graphs' replays, and the per-process cap
    applies to it)."""
    _collect()
    return torch.cuda.memory_reserved()


@pytest.mark.parametrize("level", ["lossless", "channels_last"])
@pytest.mark.parametrize("ending", ["del", "off"])
def test_memory_comes_back_when_the_module_goes_or_is_set_off(level, ending):
    start = _collect()
    vae = build_wan("wan2.1", "full").to("cuda", torch.bfloat16)
    weights = _collect() - start
    optimize(vae, level)
    with torch.no_grad():
        for height, width in ((480, 832), (256, 448)):
            vae.decode(_latents(vae, 3, height, width))
    assert report(vae).last_path == "graphs"
    assert _collect() - start > weights + RETURNED_WITHIN  # the graphs and buffers held something
    if ending == "off":
        optimize(vae, "off")
        assert abs(_collect() - start - weights) <= RETURNED_WITHIN
    del vae
    assert abs(_collect() - start) <= RETURNED_WITHIN


#: room above the reference decode's own peak in the out-of-memory test's cap (the allocator's rounding)
CAP_SLACK = 512 * 2**20


def test_a_decode_out_of_memory_on_the_graphs_frees_them_and_returns_the_reference_result():
    """Graphs of one size held, then a larger size under a memory cap of the weights plus the reference decode's
    own peak (and `CAP_SLACK`): the reference fits once the held graphs are freed, the optimized path does not
    (the sizes share one graph pool, so the cap must sit below what the larger size's graphs alone need, not
    below the sum). The first attempt runs out, the retry or the reference decode completes it.

    The result is compared with the reference decode run after the episode, not before it: under the cap
    PyTorch's cuDNN path skips conv plans whose workspace does not fit and keeps the plan it ran for that conv
    for the rest of the process, so the reference itself computes other low bits afterwards
    (`docs/data/experiments/out_of_memory_then_reference.py`)."""
    vae = build_wan("wan2.1", "full").to("cuda", torch.bfloat16)
    weights = _reserved()
    optimize(vae, "lossless")
    small, large = _latents(vae, 2, 480, 832), _latents(vae, 2, 720, 1280, seed=1)
    with torch.no_grad():
        vae.decode(small)
        held = _reserved()  # the cap counts reserved memory, graph pools whole
        torch.cuda.reset_peak_memory_stats()
        vae._rewrite_runner._reference_decode(large)  # the small size's graphs stay held
        reference_peak = torch.cuda.max_memory_reserved() - held
        cap = weights + reference_peak + CAP_SLACK
        torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(0).total_memory)
        try:
            actual = vae.decode(large).sample
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        expected = vae._rewrite_runner._reference_decode(large).sample
    gib = {name: round(value / 2**30, 2) for name, value in
           (("weights", weights), ("held", held), ("reference_peak", reference_peak), ("cap", cap))}
    assert any("out of GPU memory" in reason for reason in report(vae).fallbacks), (gib, report(vae).fallbacks)
    assert torch.equal(actual, expected)


#: issue 37's bound: graph memory of 720p + 480p + 544x960 + one latent frame at most this times 720p's alone
SHARED_BOUND = 1.3


def test_graph_memory_of_several_sizes_is_about_that_of_the_largest():
    """The sizes of one module share one pool and one cache block (`rewrite.runtime.graph_memory`): what the
    module holds after decoding four sizes stays within 1.3x of what it holds after the largest alone, allocated
    and reserved (a graph pool reserves its graphs' whole working set), and `report()` states the reserved."""
    vae = build_wan("wan2.1", "full").to("cuda", torch.bfloat16)
    weights, weights_reserved = _collect(), _reserved()
    optimize(vae, "lossless")
    held, reserved = [], []
    with torch.no_grad():
        for frames, height, width in ((2, 720, 1280), (2, 480, 832), (2, 544, 960), (1, 480, 832)):
            vae.decode(_latents(vae, frames, height, width))
            held.append(_collect() - weights)
            reserved.append(_reserved() - weights_reserved)
    memory = report(vae).graph_memory
    assert report(vae).last_path == "graphs" and len(memory.sizes) == 3, memory.lines()
    assert held[-1] <= SHARED_BOUND * held[0], (held, memory.lines())
    assert reserved[-1] <= SHARED_BOUND * reserved[0], (reserved, memory.lines())
    assert abs(memory.total - reserved[-1]) <= 0.1 * reserved[-1], (reserved, memory.lines())
