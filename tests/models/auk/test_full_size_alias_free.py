"""Full-size AuK decoder on CUDA: the fused alias-free activation against the eager chain."""

from __future__ import annotations

import math

import pytest
import torch

from rewrite.models.auk.model import AliasFreeSnakeBeta, AuKVAE
from rewrite.models.auk.alias_free import alias_free_snake

pytestmark = pytest.mark.gpu


def _snr_db(signal: torch.Tensor, reference: torch.Tensor) -> float:
    noise = (signal.double() - reference.double()).pow(2).sum().item()
    power = reference.double().pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(power / noise)


def test_fused_activation_snr_on_full_decoder_5s_clip(monkeypatch):
    torch.manual_seed(0)
    vae = AuKVAE().cuda().eval()
    z = torch.randn(1, 250, vae.config.latent_dim, generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        eager = vae.decode(z)
        monkeypatch.setattr(AliasFreeSnakeBeta, "forward",
                            lambda self, x: alias_free_snake(x, self.act.alpha, self.act.beta, self.taps, self.act.logscale))
        fused = vae.decode(z)
    snr = _snr_db(fused, eager)
    print(f"AuK 5 s clip, fp32: SNR {snr:.1f} dB, max-abs {(fused - eager).abs().max().item():.3g}")
    # The README's channels_last contract for AuK (fp32): SNR >= 70 dB against the eager decode. Speed is
    # rewrite-bench's job, not this test's.
    assert snr >= 70
