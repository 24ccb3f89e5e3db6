"""`python -m rewrite.tools.stream_bench` on the tiny Wan config on CPU: it runs, writes its JSON fields and finds
the streamed and the pushed frames `torch.equal` to `decode`'s (no timing is asserted)."""

from __future__ import annotations

import json

import pytest

from rewrite.tools import stream_bench

FIELDS = ("model", "config", "size", "frames", "latents", "batch", "dtype", "level", "repeat", "device", "warmup_s",
          "decode_s", "stream_s", "stream_first_piece_s", "session_s", "session_first_push_s",
          "session_later_push_median_s", "session_later_push_max_s", "stream_over_decode", "session_over_decode",
          "stream_bit_identical", "session_bit_identical", "first_round_session_first_push_s", "session_error", "rounds",
          "path")


def test_stream_bench_runs_on_the_tiny_config_and_writes_its_fields(tmp_path, capsys):
    path = tmp_path / "stream.json"
    code = stream_bench.main(["--model", "wan2.1", "--config", "tiny", "--device", "cpu", "--size", "32x48",
                              "--frames", "9", "--dtype", "float32", "--repeat", "2", "--json", str(path)])
    result = json.loads(path.read_text())
    assert code == 0 and set(FIELDS) <= set(result)
    assert result["stream_bit_identical"] is True and result["session_bit_identical"] is True
    assert result["session_error"] is None
    assert result["latents"] == [1, 4, 3, 4, 6] and result["path"].startswith("graphs")
    rounds = result["rounds"]
    assert len(rounds["decode_s"]) == len(rounds["session_first_push_s"]) == 2
    assert len(rounds["session_later_push_s"]) == 2 * 2  # two rounds of 3 pushes, the first of each apart
    assert all(s > 0 for s in rounds["decode_s"] + rounds["stream_s"] + rounds["session_later_push_s"])
    table = capsys.readouterr().out
    assert "torch.equal" in table and "DIFFERS" not in table and "session" in table


@pytest.mark.parametrize("argv, message", [(["--frames", "8"], "--frames must be 1 + 4k"),
                                           (["--size", "720"], "--size must look like"),
                                           (["--repeat", "0"], "--repeat and --batch must be >= 1")])
def test_stream_bench_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        stream_bench.parse_args(["--device", "cpu", *argv])
    assert message in capsys.readouterr().err


def test_a_session_the_post_quant_conv_check_refuses_is_reported_not_timed(monkeypatch, capsys):
    from rewrite.models.wan import stream

    monkeypatch.setattr(stream, "frame_local_post_quant_conv", lambda *args: False)
    result = stream_bench.measure(stream_bench.parse_args(
        ["--config", "tiny", "--device", "cpu", "--size", "32x48", "--frames", "5", "--dtype", "float32",
         "--repeat", "1"]))
    assert "post_quant_conv" in result["session_error"] and result["session_s"] is None
    assert result["session_bit_identical"] is None and result["stream_bit_identical"] is True
    assert "session: not served" in stream_bench.format_table(result)
