"""`rewrite-demo`: bad arguments stop with the usage (exit 2, no traceback); a tiny run is bit-identical and
prints no diffusers warning.

`main([...])` runs in-process; the run captures a tiny Wan 2.1 decoder on the CPU (about 15 s).
"""

from __future__ import annotations

import pytest
import torch

from rewrite.tools import demo

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


def test_a_tiny_run_is_bit_identical_and_prints_no_diffusers_warning(capfd):
    assert demo.main(["--frames", "2", "--latent-size", "4x4"]) == 0
    out, err = capfd.readouterr()
    assert "bit-identical to diffusers: True" in out and "; last call: graphs" in out
    assert "latents (1, 4, 2, 4, 4) -> video (1, 3, 5, 32, 32)" in out
    assert "should be kept in float32" not in out + err


def test_a_run_the_graphs_did_not_serve_fails(monkeypatch, capfd):
    """A fallback decode is bit-identical too: the demo must not report it as a success."""
    def failing_capture(*args, **kwargs):
        raise RuntimeError("no capture in this test")

    monkeypatch.setattr("rewrite.runtime.wan.capture_wan_decoder", failing_capture)
    assert demo.main(["--frames", "2", "--latent-size", "4x4"]) == 1
    out = capfd.readouterr().out
    assert "bit-identical to diffusers: True" in out
    assert "the optimized module did not decode through its graphs: capture failed" in out
    assert "no capture in this test" in out
