"""What the first call costs and where (`report(vae).first_call`, `WarmupResult.breakdown`), and `warmup` leaving
a later decode of its sizes nothing to capture, rewrite, check or compile."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rewrite import optimize, report, warmup
from rewrite.models.wan import capture as wan_capture
from rewrite.models.auk.model import AuKVAE
from rewrite.models.wan.config import build_wan
from rewrite.ops import compile_ahead, run_context, selftest
from rewrite.reporting import STAGES, TimingLog
from rewrite.runtime import disk_cache
from rewrite.runtime.graphs import GraphPool
from tests.graph_fakes import FakeGraphs
from tests.models.auk.test_runner import MICRO
from tests.ops.test_compile_ahead import FakeAsyncMode, FakeKernel


@pytest.fixture(autouse=True)
def no_cache_from_the_environment(monkeypatch):
    monkeypatch.delenv(disk_cache.ENV_VAR, raising=False)


@pytest.fixture(scope="module")
def warmed():
    """A fresh tiny Wan 2.1, optimized and warmed up for 4x6 latents of 3 frames (its first capture is here)."""
    vae = optimize(build_wan("wan2.1", "tiny"))
    return vae, warmup(vae, shapes=[(4, 6)], frames=[3])


def _check_records(records, graphs):
    assert records and all(t.stage in STAGES and t.seconds >= 0 for t in records)
    for name in graphs:
        stages = {t.stage for t in records if t.graph.startswith(name + " ")}
        assert {"export", "passes"} <= stages, (name, stages)


def test_warmup_returns_its_shapes_seconds_and_the_breakdown_of_its_captures(warmed):
    _, result = warmed
    assert result.shapes == [(1, 4, 6)] and result.note is None and result.seconds > 0
    _check_records(result.breakdown, ("chunk0", "steady"))
    assert sum(t.seconds for t in result.breakdown) <= result.seconds
    assert "chunk0 1x4x6 float32 cpu" in str(result) and "export" in str(result)


def test_the_report_breaks_the_first_call_down_per_graph_and_stage(warmed):
    vae, result = warmed
    summary = report(vae)
    _check_records(summary.first_call, ("chunk0", "steady"))
    assert summary.first_call[: len(result.breakdown)] == result.breakdown
    assert 0 < summary.first_call_seconds <= sum(t.seconds for t in summary.first_call)
    text = str(summary)
    assert "first-call work" in text and "steady 1x4x6 float32 cpu" in text and "passes" in text
    assert summary.disk_cache is None and "disk cache:" not in text
    by_name = {g.name: g for g in summary.graphs}
    assert by_name["chunk0"].source == "export" and by_name["chunk0"].capture_seconds > 0


def test_a_decode_after_warmup_exports_rewrites_builds_and_checks_nothing(warmed, monkeypatch):
    vae, _ = warmed
    runner = vae._rewrite_runner
    exports, rewrites = [], []
    monkeypatch.setattr(wan_capture, "export_step", lambda *a, **k: exports.append(a[0]))
    monkeypatch.setattr(runner, "rewrite_graph", lambda *a: rewrites.append(a))
    checks, builds, records = selftest.stats(), runner.cuda_graphs.captures, len(runner.timings)
    z = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = vae.decode(z).sample
        want = build_wan("wan2.1", "tiny").decode(z).sample
    assert exports == [] and rewrites == [] and selftest.stats() == checks
    assert runner.cuda_graphs.captures == builds and len(runner.timings) == records
    assert report(vae).last_path == "graphs" and torch.equal(got, want)


@pytest.mark.parametrize("frames, error, message", [
    (0, ValueError, "entry 0"),
    ([0], ValueError, "entry 0"),
    ("3", TypeError, "got '3'"),
    ([2.5], ValueError, "entry 2.5"),
    (True, TypeError, "got True"),
    ([True], ValueError, "entry True"),
    ({3: 1}, TypeError, "got {3: 1}"),
])
def test_wan_warmup_refuses_malformed_frames(wan_pair, frames, error, message):
    with pytest.raises(error, match=message):
        warmup(wan_pair("wan2.1").optimized, shapes=[(4, 6)], frames=frames)


def test_wan_warmup_frames_need_shapes(wan_pair):
    with pytest.raises(ValueError, match=r"frames= needs shapes=\[\(latent_height, latent_width\)"):
        warmup(wan_pair("wan2.1").optimized, frames=[21])


def test_wan_warmup_takes_one_frame_count_or_several(wan_pair):
    vae = wan_pair("wan2.1").optimized
    assert warmup(vae, shapes=[(4, 6)], frames=21).shapes == warmup(vae, shapes=[(4, 6)], frames=(9, 21)).shapes


def test_export_traces_without_the_fake_tensor_cache_and_restores_the_flag():
    """`export_step` makes its fake mode without the dispatch cache (the same graph, about half the steady
    graph's export time for full-size Wan on CPU); the process-wide flag is restored afterwards."""
    from rewrite.capture.export import export_step

    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch._dynamo.config.fake_tensor_cache_enabled)
            return x * 2

    before = torch._dynamo.config.fake_tensor_cache_enabled
    graph = export_step("probe", Probe(), (torch.ones(2, 3),), dynamic_dims=(0,))
    assert seen == [False] and torch._dynamo.config.fake_tensor_cache_enabled == before
    mode = next(n.meta["val"] for n in graph.graph_module.graph.nodes if n.op == "placeholder").fake_mode
    assert not mode.cache_enabled


def test_the_timing_log_keeps_the_first_and_the_last_records():
    log = TimingLog(keep=3)
    for i in range(10):
        log.add("chunk0", "export", i)
    assert len(log) == 10 and [t.seconds for t in log.records()] == [0, 1, 2, 7, 8, 9]
    assert [t.seconds for t in log.records(since=8)] == [8, 9]
    log.add("chunk0", "export", -1.0)  # a clock step backwards is no negative stage
    assert log.records(since=10)[0].seconds == 0


# ---- CUDA-graph builds ------------------------------------------------------------------------------------------
def test_an_auk_warmup_reports_its_export_passes_and_each_cuda_graph_build():
    torch.manual_seed(0)
    vae = optimize(AuKVAE(MICRO).eval(), "channels_last", compile_shapes=(64, 96), graph_backend=FakeGraphs())
    result = warmup(vae)
    assert result.shapes == [(1, 96), (1, 64)]
    _check_records(result.breakdown, ("decode",))
    built = {t.graph for t in result.breakdown if t.graph.startswith("CUDA graphs")}
    assert built == {"CUDA graphs 1x96 float32 cpu", "CUDA graphs 1x64 float32 cpu"}
    stages = {t.stage for t in result.breakdown if t.graph == "CUDA graphs 1x96 float32 cpu"}
    assert stages == {"warm-up", "capture", "self-checks", "kernel launches"}
    assert "CUDA graphs 1x64 float32 cpu" in str(report(vae))


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


def test_the_silu_self_check_runs_its_kernel_inside_a_compile_ahead_pass(monkeypatch):
    """A compile-ahead pass makes launches compile only (their outputs unwritten): the self-check inside one must
    run for real, else it would compare garbage and switch the fused SiLU off for the process."""
    monkeypatch.setattr(compile_ahead, "available", lambda: True)
    monkeypatch.setattr(compile_ahead, "AsyncCompileMode", FakeAsyncMode)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(selftest, "_RESULTS", {})
    seen = []
    monkeypatch.setattr(selftest, "silu_check", lambda device, dtype: (seen.append(run_context.current().compile_ahead),
                                                                        (True, 0, 1))[1])
    with compile_ahead.compile_ahead() as active:
        assert active and selftest.silu_is_exact(torch.device("cuda", 0), torch.bfloat16)
    assert seen == [False]


# ---- on the GPU (the lead's machine) ------------------------------------------------------------------------------
@pytest.mark.gpu
def test_on_cuda_a_decode_after_warmup_checks_compiles_and_captures_nothing(tmp_path):
    vae = optimize(build_wan("wan2.1", "tiny").to("cuda", torch.bfloat16), cache_dir=tmp_path)
    result = warmup(vae, shapes=[(8, 12)], frames=[5])
    stages = {t.stage for t in result.breakdown}
    assert {"export", "passes", "warm-up", "capture"} <= stages
    assert "compile ahead" in stages or not compile_ahead.available()
    runner = vae._rewrite_runner
    checks, builds, launches = selftest.stats(), runner.cuda_graphs.captures, compile_ahead.thread_launch_seconds()
    z = torch.randn(1, 4, 5, 8, 12, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got = vae.decode(z).sample
        want = build_wan("wan2.1", "tiny").to("cuda", torch.bfloat16).decode(z).sample
    assert selftest.stats() == checks and runner.cuda_graphs.captures == builds
    assert compile_ahead.thread_launch_seconds() == launches  # replays launch no Triton kernel
    assert torch.equal(got, want)
    assert list(tmp_path.glob("selfchecks-*.json")), "the verdicts of the captures are stored"
    again = optimize(build_wan("wan2.1", "tiny").to("cuda", torch.bfloat16), cache_dir=tmp_path)
    with torch.no_grad():
        assert torch.equal(again.decode(z).sample, want)
    assert {g.source for g in report(again).graphs} == {"disk cache"}
