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


def _time_ms(fn, repeat: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return min(times)


def test_fused_activation_snr_on_full_decoder_5s_clip(monkeypatch):
    torch.manual_seed(0)
    vae = AuKVAE().cuda().eval()
    z = torch.randn(1, 250, vae.config.latent_dim, generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        eager = vae.decode(z)
        eager_ms = _time_ms(lambda: vae.decode(z))
        monkeypatch.setattr(AliasFreeSnakeBeta, "forward",
                            lambda self, x: alias_free_snake(x, self.act.alpha, self.act.beta, self.taps, self.act.logscale))
        fused = vae.decode(z)
        fused_ms = _time_ms(lambda: vae.decode(z))
    snr = _snr_db(fused, eager)
    print(f"AuK 5 s clip, fp32: eager {eager_ms:.1f} ms, fused activation {fused_ms:.1f} ms (no CUDA graph), "
          f"SNR {snr:.1f} dB, max-abs {(fused - eager).abs().max().item():.3g}")
    assert snr >= 70
