"""The AuK family's row of the models table (`rewrite.supported`): the project's reference `AuKVAE`. Imports
nothing heavy: the runner, model and capture are imported when the row is used."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from rewrite.models.supported_model import SupportedModel, instance_of

if TYPE_CHECKING:
    from rewrite.capture.export import CapturedGraph


def _runner() -> type:
    from rewrite.models.auk.runner import AuKRunner

    return AuKRunner


def _make(config: str, seed: int) -> nn.Module:
    from rewrite.models.auk.model import AuKConfig, AuKVAE

    return AuKVAE(AuKConfig() if config == "full" else AuKConfig.tiny()).eval()


def _capture(module: nn.Module, dtype: torch.dtype, device: torch.device,
             activations_as_ops: bool = True) -> list[CapturedGraph]:
    from rewrite.models.auk.capture import capture_auk_decode

    return [capture_auk_decode(module, dtype, device, activations_as_ops=activations_as_ops)]


ROWS: tuple[SupportedModel, ...] = (SupportedModel(
    name="auk", family="auk", type_name="rewrite.models.auk.AuKVAE", label=None,
    load_runner=_runner,
    recognise=lambda module: instance_of(module, "rewrite.models.auk.model", "AuKVAE"),
    make=_make, capture_graphs=_capture, graph_names=("decode",),
    latent_dims=("batch", "frames", "channels"), capture_options=("activations_as_ops",), meta_capture=True),)
