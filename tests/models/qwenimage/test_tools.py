"""Qwen-Image's VAE in the tools that read the models table: `rewrite-debug qwenimage`, `rewrite-demo --model
qwenimage`, `rewrite-bench --model qwenimage`, and `report()` of an optimized model.

The Wan patterns match Qwen-Image's graphs exactly as they match Wan 2.1's (same ATen graphs: same counts per
pattern family at every level), and their module-type checks see the Qwen-Image classes as their Wan
counterparts (no pattern is listed as "other model" that applies to Wan 2.1).
"""

from __future__ import annotations

import json

import pytest
import torch

from rewrite import optimize, report, supported
from rewrite.models.qwenimage.config import build_qwenimage
from rewrite.tools import debug, demo


def _json(capsys, *argv) -> dict:
    debug.main([*argv, "--json"])
    return json.loads(capsys.readouterr().out)


def _summary(capsys, *argv) -> list[str]:
    debug.main(list(argv))
    out = capsys.readouterr().out
    return [line for line in out.splitlines()[1:] if not line.startswith(("rewrite-debug", "sizes:"))]


@pytest.mark.parametrize("level", ("lossless", "channels_last"))
def test_debug_lists_the_same_matches_as_for_wan21(capsys, level):
    qwen = _summary(capsys, "qwenimage", "--level", level, "--dtype", "bfloat16")
    wan = _summary(capsys, "wan2.1", "--level", level, "--dtype", "bfloat16")
    assert qwen == wan
    assert any(line.startswith("causal_conv_input") for line in qwen)


def test_debug_json_names_the_matches(capsys):
    report_json = _json(capsys, "qwenimage")
    assert [g["name"] for g in report_json["graphs"]] == ["chunk0", "steady"]
    text = json.dumps(report_json)
    for family in ("rms_norm", "causal_conv_input", "conv3d_residual", "rms_norm_causal_conv3d"):
        assert family in text


def test_graph_names_of_the_row_are_the_captured_ones():
    row = supported.get("qwenimage")
    graphs = row.capture(row.build("tiny"), torch.float32, torch.device("cpu"))
    assert [g.name for g in graphs] == list(row.graph_names)


def test_report_shows_the_graphs_served():
    vae = optimize(build_qwenimage("tiny"), level="lossless")
    with torch.no_grad():
        vae.decode(torch.randn(1, 4, 1, 5, 6))
    text = str(report(vae))
    assert "AutoencoderKLQwenImage at level 'lossless'; last call: graphs" in text
    assert "chunk0" in text and "steady" in text and "rms_norm_causal_conv3d" in text


def test_demo_passes(capsys):
    assert demo.main(["--model", "qwenimage", "--frames", "1", "--latent-size", "5x7"]) == 0
    assert "PASS" in capsys.readouterr().out
