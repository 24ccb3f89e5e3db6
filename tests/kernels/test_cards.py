"""The per-shape kernel choices serve only the cards they were measured on (`rewrite.kernels.cards`); the
patterns that use them decline elsewhere with the reason, and the graph keeps the `lossless` ops."""

from __future__ import annotations

import pytest
import torch

from rewrite.kernels import cards
from rewrite.kernels.conv3d import conv3d
from rewrite.patterns.common.guards import triton_kernel_runs

CUDA = torch.device("cuda", 0)


@pytest.fixture
def card(monkeypatch):
    """Name the CUDA card (no CUDA device is needed: only the name is read)."""
    def named(name: str) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    return named


@pytest.mark.parametrize("name", sorted(cards.MEASURED_CARDS))
def test_a_measured_card_takes_the_tables(card, name):
    card(name)
    assert cards.unmeasured_card_reason(CUDA) is None
    assert triton_kernel_runs(CUDA, "the Triton conv") is None


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe", "NVIDIA B200"])
def test_any_other_card_takes_the_safe_choice_and_says_why(card, name):
    card(name)
    reason = triton_kernel_runs(CUDA, "the Triton conv")
    assert reason == cards.unmeasured_card_reason(CUDA)
    assert name in reason and "NVIDIA H200" in reason and "safe choice" in reason


def test_the_cpu_is_not_a_card():
    assert cards.unmeasured_card_reason(torch.device("cpu")) is None


def test_a_card_with_its_own_conv_tiles_takes_them_for_those_shapes_only(card):
    h100, (shape, tile) = "NVIDIA H100 80GB HBM3", next(iter(conv3d.CARD_TILES["NVIDIA H100 80GB HBM3"].items()))
    card(h100)
    assert conv3d.card_launch_config(*shape, 3, CUDA) == tile
    assert conv3d.card_launch_config(shape[0], shape[1], shape[2] + 64, 3, CUDA) == conv3d.launch_config(
        shape[0], shape[1], shape[2] + 64)
    card("NVIDIA H200")
    assert conv3d.card_launch_config(*shape, 3, CUDA) == conv3d.launch_config(*shape)
    assert conv3d.card_launch_config(*shape, 3, torch.device("cpu")) == conv3d.launch_config(*shape)
