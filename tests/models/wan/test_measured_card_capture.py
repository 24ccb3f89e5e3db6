"""Captures at ``channels_last`` as they run on a measured card: the pattern guards read the card's per-shape
tables (`rewrite.kernels.cards`) on the graph's symbolic shapes, which a CPU device never does (its card name is
None). Each case names a measured card for the CPU and checks that the encoder's and the decoder's captures
succeed (the graphs serve the calls), for the Wan-family models, and for Wan 2.2 also with no Winograd entry.

CPU under the Triton interpreter (the guards' "kernel runs" check); tiny configs, bf16. What the calls compute is
checked elsewhere (tests/models/wan/test_encode.py, test_decode.py): here only that no capture fails.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rewrite import optimize, report, supported
from rewrite.kernels import cards
from rewrite.kernels.winograd import common as winograd_common
from rewrite.ops.dispatch import INTERPRETING
from tests import quick

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
CASES = [pytest.param("wan2.2", H100, "as shipped", id="wan2.2-h100")] + [
    pytest.param(model, card, winograd, id=ident, marks=quick.slow) for model, card, winograd, ident in (
        ("wan2.2", H100, "no Winograd entry", "wan2.2-h100-no-winograd"), ("wan2.2", H200, "as shipped", "wan2.2-h200"),
        ("wan2.1", H100, "as shipped", "wan2.1-h100"), ("wan2.1", H200, "as shipped", "wan2.1-h200"),
        ("qwenimage", H100, "as shipped", "qwenimage-h100"))]


def test_the_cases_name_measured_cards():
    assert {H100, H200} <= set(cards.MEASURED_CARDS)


@pytest.mark.skipif(not INTERPRETING, reason="the guards admit kernels on CPU only under TRITON_INTERPRET=1")
@pytest.mark.parametrize("model,card,winograd", CASES)
def test_captures_on_a_measured_card(monkeypatch, model, card, winograd):
    monkeypatch.setattr(cards, "name", lambda device: card)
    if winograd == "no Winograd entry":
        monkeypatch.setattr(winograd_common, "_MEASURED_FASTER", {})
    vae = supported.get(model).build("tiny", dtype=torch.bfloat16)
    optimized = optimize(copy.deepcopy(vae), "channels_last")
    video = torch.randn(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    latents = torch.randn(1, vae.config.z_dim, 2, 4, 4, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        optimized.encode(video)
        assert (report(optimized).last_path, report(optimized).last_reason) == ("graphs", None)
        optimized.decode(latents)
        assert (report(optimized).last_path, report(optimized).last_reason) == ("graphs", None)
