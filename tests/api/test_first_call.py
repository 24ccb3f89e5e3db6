"""What the first call costs and where (`report(vae).first_call`, `WarmupResult.breakdown`), and `warmup` leaving
a later decode of its sizes nothing to capture, rewrite, check or compile."""

from __future__ import annotations

import pytest
import torch

from rewrite import optimize, report, warmup
from rewrite.models.wan import capture as wan_capture
from rewrite.models.auk.model import AuKVAE
from rewrite.models.wan.config import build_wan
from rewrite.ops import compile_ahead, run_context, selftest
from rewrite.reporting import STAGES
from rewrite.runtime import disk_cache
from tests.graph_fakes import FakeGraphs
from tests.models.auk.test_runner import MICRO
from tests.ops.test_compile_ahead import FakeAsyncMode


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
