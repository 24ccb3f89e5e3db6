"""Out of memory on the optimized path is a fallback, never a crash (issue 37's third item), on the CPU.

A `torch.OutOfMemoryError` is injected where a GPU decode can run out: the export of the FX graphs (on a GPU its
self-checks run real tensors: seen on an H100), the CUDA-graph capture, a replay, and a rewritten graph run
eagerly. The runner frees what it holds on the device (`release_device_memory`) and tries
again; out of memory a second time, it frees it again and runs the reference decode. Either way the call
returns the reference's result (`torch.equal`: the CPU graphs are exact at `lossless`), the report says what
happened, and the module keeps its CUDA graphs for the next call (an out-of-memory is not a failed capture).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rewrite import optimize, report
from rewrite.models.auk.capture import reference_decode
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import build_wan
from rewrite.models.wan import runner as wan_runtime
from rewrite.models.wan import steps as wan_steps
from rewrite.runtime.runner import OUT_OF_MEMORY_REASON, DecoderRunner, installed_runner
from tests import quick
from tests.graph_fakes import FakeGraphs, FakeStep

MICRO = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                  resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))
RETRIED = "out of GPU memory on the optimized path (CUDA out of memory. Tried to allocate 2.00 GiB)"


class OutOfMemory:
    """Raises `torch.OutOfMemoryError` on the first `times` calls, then calls through to `wrapped`."""

    def __init__(self, wrapped, times: int):
        self.wrapped, self.left, self.raised = wrapped, times, 0

    def __call__(self, *args, **kwargs):
        if self.left:
            self.left -= 1
            self.raised += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.wrapped(*args, **kwargs)


def _wan_pair():
    reference = build_wan("wan2.1", "tiny")
    optimized = optimize(copy.deepcopy(reference), "lossless")
    installed_runner(optimized).graph_backend = FakeGraphs()
    z = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(0))
    return reference, optimized, z


def _inject_wan(monkeypatch, where: str, times: int) -> OutOfMemory:
    """An out-of-memory at the export, the capture, the replay or the eager graphs of a tiny Wan decode."""
    if where == "export":
        fake = OutOfMemory(DecoderRunner.capture_graphs, times)
        monkeypatch.setattr(DecoderRunner, "capture_graphs", lambda self, *a, **k: fake(self, *a, **k))
    elif where == "capture":
        fake = OutOfMemory(FakeGraphs.capture, times)
        monkeypatch.setattr(FakeGraphs, "capture", lambda self, *a: fake(self, *a))
    elif where == "replay":
        fake = OutOfMemory(FakeStep.replay, times)
        monkeypatch.setattr(FakeStep, "replay", lambda self: fake(self))
    else:  # the rewritten graphs run eagerly (no CUDA graphs)
        fake = OutOfMemory(wan_steps.EagerSteps.first, times)
        monkeypatch.setattr(wan_steps.EagerSteps, "first", lambda self, x: fake(self, x))
    return fake


def _wan_decode_out_of_memory(monkeypatch, where: str, times: int):
    """A tiny Wan decode (CUDA-graph stand-ins, or the graphs run eagerly for "eager") with `times`
    out-of-memory errors injected at `where`: (optimized module, its runner, latents, reference video)."""
    reference, optimized, z = _wan_pair()
    runner = installed_runner(optimized)
    if where == "eager":
        runner.use_cuda_graphs = False
    fake = _inject_wan(monkeypatch, where, times)
    with torch.no_grad():
        expected, got = reference.decode(z).sample, optimized.decode(z).sample
    assert fake.raised == times and torch.equal(got, expected)
    return optimized, runner, z, expected


@pytest.mark.parametrize("where", ["export", "capture", "replay", "eager"])
def test_wan_runs_out_of_memory_once_frees_its_graphs_and_decodes_through_them_again(monkeypatch, where):
    optimized, runner, _, _ = _wan_decode_out_of_memory(monkeypatch, where, times=1)
    result = report(optimized)
    assert result.last_path == "graphs"
    assert any(reason.startswith(RETRIED) for reason in result.fallbacks)
    assert runner.use_cuda_graphs == (where != "eager")  # out of memory is no failed capture
    if where != "eager":
        assert len(runner.cuda_graphs) == 1  # captured again after the release


@pytest.mark.parametrize("where", ["export", pytest.param("capture", marks=quick.slow), "replay",
                                   pytest.param("eager", marks=quick.slow)])
def test_wan_out_of_memory_twice_takes_the_reference_decode_and_later_calls_the_graphs(monkeypatch, where):
    optimized, runner, z, expected = _wan_decode_out_of_memory(monkeypatch, where, times=2)
    with torch.no_grad():
        assert report(optimized).last_path == "reference"
        assert report(optimized).last_reason == OUT_OF_MEMORY_REASON
        assert len(runner.cuda_graphs) == 0  # freed again before the reference decode ran
        assert runner.graphs.errors == {}  # out of memory is no failed capture
        assert torch.equal(optimized.decode(z).sample, expected)  # memory back: the graphs serve again
    assert report(optimized).last_path == "graphs"


def test_wan_tiled_decode_out_of_memory_twice_takes_the_reference_tiled_decode(monkeypatch):
    reference, optimized, _ = _wan_pair()
    for vae in (reference, optimized):
        vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=16,
                          tile_sample_stride_width=16)
    z = torch.randn(1, 4, 2, 6, 6, generator=torch.Generator().manual_seed(1))
    fake = OutOfMemory(wan_runtime.run_graph_chunk, 2)  # tiles run the graph modules eagerly, chunk by chunk
    monkeypatch.setattr(wan_runtime, "run_graph_chunk", fake)
    with torch.no_grad():
        expected, got = reference.decode(z).sample, optimized.decode(z).sample
    assert fake.raised == 2 and torch.equal(got, expected)
    assert report(optimized).last_reason == OUT_OF_MEMORY_REASON


def _auk_pair(level):
    torch.manual_seed(0)
    reference = AuKVAE(MICRO).eval()
    optimized = optimize(copy.deepcopy(reference), level, graph_backend=FakeGraphs(), compile_shapes=(64,))
    z = torch.randn(1, 50, MICRO.latent_dim, generator=torch.Generator().manual_seed(0))
    return reference, optimized, z


@pytest.mark.parametrize("where,times", quick.product({"capture": ("capture",), "replay": ("replay",)},
                                                      {"once": (1,), "twice": (2,)}))
def test_auk_out_of_memory_frees_the_graphs_then_retries_or_takes_the_reference(monkeypatch, where, times):
    reference, optimized, z = _auk_pair("lossless")
    cls, name = (FakeGraphs, "capture") if where == "capture" else (FakeStep, "replay")
    fake = OutOfMemory(getattr(cls, name), times)
    monkeypatch.setattr(cls, name, lambda self, *a: fake(self, *a))
    with torch.no_grad():
        got = optimized.decode(z)
        assert fake.raised == times and torch.equal(got, reference_decode(reference, z))
        result = report(optimized)
        assert any(reason.startswith(RETRIED) for reason in result.fallbacks)
        assert result.last_path == ("graphs" if times == 1 else "reference")
        assert optimized._rewrite_runner.capture_failures == {}  # out of memory is no failed capture
        assert torch.equal(optimized.decode(z), got)
    assert report(optimized).last_path == "graphs"


def test_errors_other_than_out_of_memory_are_not_retried(monkeypatch):
    _, optimized, z = _wan_pair()
    runner = installed_runner(optimized)
    runner.use_cuda_graphs = False
    monkeypatch.setattr(wan_steps.EagerSteps, "first", lambda self, x: (_ for _ in ()).throw(ValueError("bug")))
    with torch.no_grad(), pytest.raises(ValueError, match="bug"):
        optimized.decode(z)


@pytest.mark.parametrize("times", [1, 2])
def test_a_streamed_wan_clip_out_of_memory_mid_clip_still_streams_the_reference_frames(monkeypatch, times):
    """`decode_stream`: out of memory at the replay of a later latent frame frees the module's graphs (the clip's
    caches, paused in them, are copied out first) and tries again, then the reference decoder continues from
    the clip's caches; the pieces are still the whole decode."""
    reference, optimized, z = _wan_pair()
    with torch.no_grad():
        expected = reference.decode(z).sample
        pieces = optimized.decode_stream(z)
        first = [next(pieces)]  # chunk 0 through the graphs: the clip is paused in the static caches
        fake = OutOfMemory(FakeStep.replay, times)
        monkeypatch.setattr(FakeStep, "replay", lambda self: fake(self))
        streamed = torch.cat([frames for _, frames in first + list(pieces)], dim=2)
    assert fake.raised == times and torch.equal(streamed, expected)
    reasons = report(optimized).fallbacks
    assert any(reason.startswith(RETRIED) for reason in reasons)
    assert (OUT_OF_MEMORY_REASON in reasons) == (times == 2)
