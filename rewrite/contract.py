"""The `channels_last` level's contract for the video decoders (Wan, Qwen-Image): one check the tests and tools
share.

At `channels_last` fp32 sums run in other orders than `off`'s and some roundings move; through the decoder's
layers of bf16/fp16 activations these become a noise-like difference spread over every output value. Two
numbers bound it, over the [-1, 1] video range (peak-to-peak 2):

* PSNR >= `MIN_PSNR_DB` (45 dB): the difference's RMS is at most 2 * 10 ** (-45 / 20), about 0.0112.
* max-abs <= `EXTREME_FACTOR` * RMS * sqrt(2 ln N), N the number of output values. sqrt(2 ln N) * RMS is where
  the largest of N samples of Gaussian noise of that RMS lands, so the bound grows with the video as the largest
  difference of a noise-like error does; a localized error (a wrong tile, row, frame or border: a few values far
  off while the RMS stays low) breaks it. A fixed max-abs cannot do both: 6e-2 held to 720p and failed at
  1088x1920x81 with the same RMS. The factor: the measured decodes' largest differences lie at 0.95-1.19 times
  sqrt(2 ln N) * RMS (Wan 2.1 / 2.2 and Qwen-Image, 480p to 1088x1920, 1 to 81 frames, H100 and H200;
  docs/results.md, session 26), and 1.5 leaves a quarter above the largest. With the PSNR floor it caps max-abs
  at about 0.11 for any video up to 1088x1920x241.

A bit-identical result (fp32, where `channels_last` keeps the `lossless` ops) has RMS 0 and max-abs 0.

An encode (Wan's `vae.encode`) is held to the same check on the posterior's mean against `off`'s, the PSNR taken
over the same peak-to-peak of 2 (the latents have no fixed range; this keeps one number for both directions).
"""

from __future__ import annotations

import dataclasses
import math

import torch

#: the PSNR floor against `off` over the [-1, 1] range
MIN_PSNR_DB = 45.0
#: how far above the Gaussian extreme sqrt(2 ln N) * RMS the largest difference may lie (module docstring)
EXTREME_FACTOR = 1.5
#: peak-to-peak of the video range the PSNR is taken over
PEAK_TO_PEAK = 2.0


@dataclasses.dataclass(frozen=True)
class VideoDifference:
    """A decode against its `off` reference: largest and RMS difference over `values` output values."""

    max_abs: float
    rms: float
    values: int

    @property
    def psnr_db(self) -> float:
        return math.inf if self.rms == 0 else 20 * math.log10(PEAK_TO_PEAK / self.rms)

    @property
    def max_abs_bound(self) -> float:
        """`EXTREME_FACTOR` * RMS * sqrt(2 ln N)."""
        return EXTREME_FACTOR * self.rms * math.sqrt(2 * math.log(max(self.values, 2)))

    def violation(self) -> str | None:
        """None within the contract, else what breaks it."""
        if self.psnr_db < MIN_PSNR_DB:
            return f"PSNR {self.psnr_db:.1f} dB below {MIN_PSNR_DB} dB (RMS {self.rms:.3g})"
        if self.max_abs > self.max_abs_bound:
            return (f"max-abs {self.max_abs:.3g} above {EXTREME_FACTOR} x RMS {self.rms:.3g} x sqrt(2 ln "
                    f"{self.values}) = {self.max_abs_bound:.3g}: larger than a noise-like difference reaches")
        return None

    def __str__(self) -> str:
        return f"max-abs {self.max_abs:.3g} (bound {self.max_abs_bound:.3g}), PSNR {self.psnr_db:.1f} dB"


def video_difference(actual: torch.Tensor, expected: torch.Tensor) -> VideoDifference:
    """The difference of two videos (or images) of one shape, in fp32."""
    if actual.shape != expected.shape:
        raise ValueError(f"expected two videos of one shape, got {tuple(actual.shape)} and {tuple(expected.shape)}")
    diff = actual.float() - expected.float()
    return VideoDifference(max_abs=diff.abs().max().item() if diff.numel() else 0.0,
                           rms=diff.square().mean().sqrt().item() if diff.numel() else 0.0, values=diff.numel())
