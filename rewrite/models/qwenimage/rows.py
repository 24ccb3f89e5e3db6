"""Qwen-Image's row of the models table (`rewrite.supported`): diffusers' `AutoencoderKLQwenImage`, driven by the
Wan family's runner (its `family` is "wan": the tools treat it as a Wan video decoder). Imports nothing heavy:
the runner, builder and capture are imported when the row is used."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import nn

from rewrite.models.supported_model import SupportedModel, instance_of
from rewrite.models.wan import rows as wan_rows

if TYPE_CHECKING:
    from rewrite.capture.export import CapturedGraph


def _runner() -> type:
    from rewrite.models.qwenimage.runner import QwenImageRunner

    return QwenImageRunner


def _make(config: str, seed: int) -> nn.Module:
    from rewrite.models.qwenimage.config import build_qwenimage

    return build_qwenimage(config, seed=seed)


def _capture(module: nn.Module, dtype: torch.dtype, device: torch.device) -> list[CapturedGraph]:
    from rewrite.models.qwenimage.runner import capture_qwenimage

    return capture_qwenimage(module, dtype, device)


def _capture_encoder(module: nn.Module, dtype: torch.dtype, device: torch.device) -> list[CapturedGraph]:
    from rewrite.models.qwenimage import runner as family  # noqa: F401  (registers the family's class names)

    return wan_rows.ENCODER.capture_graphs(module, dtype, device)


ROWS: tuple[SupportedModel, ...] = (SupportedModel(
    name="qwenimage", family="wan", type_name="diffusers.AutoencoderKLQwenImage", label=None,
    load_runner=_runner,
    recognise=lambda module: instance_of(module, "diffusers.models.autoencoders.autoencoder_kl_qwenimage",
                                         "AutoencoderKLQwenImage"),
    make=_make, capture_graphs=_capture,
    graph_names=("chunk0", "steady"), latent_dims=("batch", "channels", "frames", "height", "width"),
    encoder=dataclasses.replace(wan_rows.ENCODER, capture_graphs=_capture_encoder)),)
