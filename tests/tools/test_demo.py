"""`rewrite-demo`: bad arguments stop with the usage (exit 2, no traceback); a tiny run says what it does, then
the verdict (bit-identical), then a short summary with the CPU note, and prints no diffusers warning; the
whole report only with --report; a reader that closes stdout early ends it quietly.

`main([...])` runs in-process. One real run captures a tiny Wan 2.1 decoder on the CPU (about 15 s); the
tests of the output's form replace the slow part (`demo.decode_both`) with a made-up outcome.
"""

from __future__ import annotations

import io

import pytest
import torch

from rewrite.reporting import GraphReport, Report
from rewrite.tools import demo
from rewrite.tools.cli_output import BROKEN_PIPE_STATUS

BAD = [
    (["--frames", "0"], "--frames must be at least 1 latent frame, got 0"),
    (["--frames", "-3"], "--frames must be at least 1 latent frame, got -3"),
    (["--latent-size", "0x8"], "--latent-size must be two positive integers like 8x8, got '0x8'"),
    (["--latent-size", "8x-1"], "--latent-size must be two positive integers"),
    (["--latent-size", "8"], "--latent-size must be two positive integers"),
    (["--latent-size", "axb"], "--latent-size must be two positive integers"),
    (["--device", "gpu0"], "--device 'gpu0' is not a device"),
    (["--model", "auk"], "invalid choice: 'auk'"),
]
if not torch.cuda.is_available():
    BAD.append((["--device", "cuda"], "--device cuda: CUDA is not available on this machine"))


@pytest.mark.parametrize("argv, message", BAD)
def test_bad_arguments_exit_2_with_usage(argv, message, monkeypatch, capsys):
    monkeypatch.setattr("rewrite.supported.SupportedModel.build", lambda *a, **k: pytest.fail("built a model"))
    with pytest.raises(SystemExit) as stop:
        demo.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "usage: rewrite-demo" in err and message in err and "Traceback" not in err


def test_a_tiny_run_says_what_it_does_then_the_verdict_then_a_summary(capfd):
    """With --report: the intro, the verdict, the summary (the CPU note in it), then the whole report."""
    assert demo.main(["--frames", "2", "--latent-size", "4x4", "--report"]) == 0
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert lines[0] == ("rewrite-demo: decoding 2 latent frames of 4x4 with a random-init wan2.1 (tiny, float32, "
                        "cpu), by diffusers and at level lossless ...")
    assert lines[1] == "PASS: bit-identical to diffusers: True, decoded through the rewritten graphs"
    assert lines[2] == "  latents (1, 4, 2, 4, 4) -> video (1, 3, 5, 32, 32)"
    assert lines[3].startswith("  graphs: chunk0 (") and " ops), steady (" in lines[3] and " matches of " in lines[3]
    assert lines[4].startswith("  time: diffusers ") and "optimized first call" in lines[4]
    assert lines[5] == f"  {demo.CPU_NOTE}"
    assert lines[6].startswith("AutoencoderKLWan at level 'lossless'; last call: graphs")  # the report follows
    assert "should be kept in float32" not in out + err


def made_up_outcome(**changes) -> demo.Outcome:
    """What `decode_both` returns for a tiny run, its report's CPU-only guard rejection included."""
    graphs = [GraphReport(name, "torch.float32", "cpu", nodes, 1.0, {"rms_norm[act=silu, half=None]": 21}, [],
                          declined={"residual_bias": {"guard failed: the graph runs on cpu": 2}}, sizes="1x4x4",
                          ops=ops) for name, nodes, ops in (("chunk0", 194, 108), ("steady", 220, 110))]
    report = Report("AutoencoderKLWan", "lossless", graphs, fallbacks={}, last_path="graphs", last_reason=None)
    values = dict(latents=(1, 4, 2, 4, 4), video=(1, 3, 5, 32, 32), identical=True, max_abs=0.0, reference_s=1.5,
                  first_call_s=6.0, report=report)
    return demo.Outcome(**{**values, **changes})


def test_without_report_the_summary_is_short_and_shows_no_declined_candidates(monkeypatch, capsys):
    monkeypatch.setattr(demo, "decode_both", lambda args: made_up_outcome())
    assert demo.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("PASS: bit-identical to diffusers: True")
    assert "  graphs: chunk0 (108 ops), steady (110 ops); 42 matches of 1 pattern" in lines
    assert f"  {demo.CPU_NOTE}" in lines and lines[-1].startswith("  --report prints the whole report")
    assert len(lines) <= 8 and max(len(line) for line in lines) <= 140
    assert not any("declined x" in line or "guard failed" in line for line in lines)


def test_a_difference_at_lossless_fails_with_the_max_abs_difference(monkeypatch, capsys):
    monkeypatch.setattr(demo, "decode_both", lambda args: made_up_outcome(identical=False, max_abs=0.0039))
    assert demo.main([]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == ("FAIL: bit-identical to diffusers: False (max abs difference 0.0039), decoded through the "
                        "rewritten graphs")


def test_a_reader_that_closes_stdout_ends_the_demo_quietly(monkeypatch, capsys):
    """The intro is the first write: the demo stops there, before building anything, exit status 141."""
    class ClosedStdout(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("rewrite.supported.SupportedModel.build", lambda *a, **k: pytest.fail("built a model"))
    monkeypatch.setattr("sys.stdout", ClosedStdout())
    assert demo.main([]) == BROKEN_PIPE_STATUS
    assert capsys.readouterr().err == ""


def test_a_run_the_graphs_did_not_serve_fails(monkeypatch, capfd):
    """A fallback decode is bit-identical too: the demo must not report it as a success."""
    def failing_capture(*args, **kwargs):
        raise RuntimeError("no capture in this test")

    monkeypatch.setattr("rewrite.models.wan.runner.capture_wan_decoder", failing_capture)
    assert demo.main(["--frames", "2", "--latent-size", "4x4"]) == 1
    lines = capfd.readouterr().out.splitlines()
    assert lines[1] == "FAIL: bit-identical to diffusers: True"
    assert lines[2].startswith("the optimized module did not decode through its graphs: capture failed")
    assert "no capture in this test" in lines[2]
