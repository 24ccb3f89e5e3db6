"""Captures at ``channels_last`` as they run on a measured card: the pattern guards read the card's per-shape
tables (`rewrite.kernels.cards`) on the graph's symbolic shapes, which a CPU device never does (its card name is
None). Each case names a measured card for the CPU and checks that Wan 2.2's encoder and decoder captures succeed
(the graphs serve the calls), with the tables as shipped and with no Winograd entry (the table as it was).

CPU under the Triton interpreter (the guards' "kernel runs" check); tiny config, bf16. What the calls compute is
checked elsewhere (tests/models/wan/test_encode.py, test_decode.py): here only that no capture fails.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rewrite import optimize, report
from rewrite.kernels import cards
from rewrite.kernels.winograd import common as winograd_common
from rewrite.models.wan.config import build_wan
from rewrite.ops.dispatch import INTERPRETING
from tests import quick

H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.skipif(not INTERPRETING, reason="the guards admit kernels on CPU only under TRITON_INTERPRET=1")
@pytest.mark.parametrize("winograd", ("as shipped", pytest.param("no Winograd entry", marks=quick.slow)))
def test_wan22_captures_on_a_measured_card(monkeypatch, winograd):
    monkeypatch.setattr(cards, "name", lambda device: H100)
    if winograd == "no Winograd entry":
        monkeypatch.setattr(winograd_common, "_MEASURED_FASTER", {})
    vae = build_wan("wan2.2", "tiny").to(torch.bfloat16)
    optimized = optimize(copy.deepcopy(vae), "channels_last")
    video = torch.randn(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    latents = torch.randn(1, vae.config.z_dim, 2, 4, 4, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        optimized.encode(video)
        assert (report(optimized).last_path, report(optimized).last_reason) == ("graphs", None)
        optimized.decode(latents)
        assert (report(optimized).last_path, report(optimized).last_reason) == ("graphs", None)
