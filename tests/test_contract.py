"""The `channels_last` video contract (`rewrite.contract`): a noise-like difference at the measured decodes'
level passes at any size, the same noise with a few values far off does not, the PSNR floor holds."""

from __future__ import annotations

import math

import pytest
import torch

from rewrite.contract import EXTREME_FACTOR, MIN_PSNR_DB, VideoDifference, video_difference


def _video(seed: int = 0, shape=(1, 3, 9, 96, 160)) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize("shape", [(1, 3, 1, 64, 64), (1, 3, 9, 96, 160), (2, 3, 21, 128, 224)])
def test_gaussian_noise_at_the_decodes_rms_is_within_at_every_size(shape):
    expected = _video(shape=shape)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 0.008  # about 48 dB, as decodes read
    difference = video_difference(expected + noise, expected)
    assert difference.violation() is None, difference
    assert 0.8 < difference.max_abs / (difference.max_abs_bound / EXTREME_FACTOR) < 1.2  # the Gaussian extreme


def test_a_localized_error_breaks_it_while_the_psnr_stays_high():
    expected = _video()
    broken = expected + torch.randn(expected.shape, generator=torch.Generator().manual_seed(1)) * 0.008
    broken[0, :, 4, 10:12, 20:60] += 0.1  # one wrong strip of a tile: 240 values of 414720
    difference = video_difference(broken, expected)
    assert difference.psnr_db > MIN_PSNR_DB and difference.max_abs < 0.15
    assert "larger than a noise-like difference reaches" in difference.violation()


def test_the_psnr_floor_and_equality():
    expected = _video()
    assert video_difference(expected, expected) == VideoDifference(0.0, 0.0, expected.numel())
    assert video_difference(expected, expected).violation() is None and video_difference(expected, expected).psnr_db == math.inf
    noisy = expected + torch.randn(expected.shape, generator=torch.Generator().manual_seed(2)) * 0.02  # about 40 dB
    assert "below 45.0 dB" in video_difference(noisy, expected).violation()
    with pytest.raises(ValueError, match="one shape"):
        video_difference(expected, expected[:, :, :1])
