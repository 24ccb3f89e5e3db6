"""`python -m rewrite.tools.sweep_sizes`: its verdict per (model, size) and its argument checks (the sweep
itself is `rewrite-bench` per size, tested in tests/tools/test_bench.py)."""

from __future__ import annotations

import pytest

from rewrite.tools import sweep_sizes


def _summary(speedup: float, equal: bool) -> dict:
    return {"size": "1088x1920", "frames": 81, "device": "NVIDIA H100 80GB HBM3", "levels": [
        {"level": "off", "best_s": 10.0, "speedup": 1.0, "peak_gib": 30.0, "bit_identical": None},
        {"level": "lossless", "best_s": 10.0 / speedup, "speedup": speedup, "peak_gib": 29.0, "bit_identical": equal}]}


@pytest.mark.parametrize("model,speedup,equal,meets", [("wan2.1", 2.0, True, True), ("wan2.1", 1.43, True, False),
                                                       ("wan2.2", 1.8, True, True), ("wan2.2", 2.5, False, False)])
def test_lossless_meets_its_target_only_bit_identical_and_fast_enough(model, speedup, equal, meets):
    row = sweep_sizes.verdict(model, _summary(speedup, equal))
    assert row["meets_target"] is meets and row["target"] == sweep_sizes.TARGETS[model]
    assert row["lossless_speedup"] == speedup and row["off_peak_gib"] == 30.0
    assert row["off_s_per_latent_frame"] == 10.0 / 21  # 81 frames: 21 latent frames
    line = sweep_sizes.summary_line(row)
    assert ("meets" if meets else "BELOW") in line and "channels_last n/a" in line
    assert row["peaks_within_off"] is True and "peaks <= off" in line


def test_a_level_whose_peak_passes_offs_is_flagged():
    summary = _summary(2.0, True)
    summary["levels"][1]["peak_gib"] = 31.0
    row = sweep_sizes.verdict("wan2.1", summary)
    assert row["peaks_within_off"] is False and "PEAK ABOVE" in sweep_sizes.summary_line(row)
    summary["levels"][0]["peak_gib"] = None  # a CPU run reads no peaks
    assert "peaks_within_off" not in sweep_sizes.verdict("wan2.1", summary)


def test_an_unknown_model_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exited:
        sweep_sizes.main(["--models", "wan2.1,auk"])
    assert exited.value.code == 2 and "expected from wan2.1, wan2.2, got auk" in capsys.readouterr().err
