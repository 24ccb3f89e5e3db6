"""The Wan family's rows of the models table (`rewrite.supported`): Wan 2.1 and Wan 2.2, both diffusers'
`AutoencoderKLWan` (2.2 is the class configured with residual up blocks). Imports nothing heavy: the runner,
builder and capture are imported when a row is used."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from rewrite.models.supported_model import EncoderCapture, SupportedModel, instance_of

if TYPE_CHECKING:
    from rewrite.capture.export import CapturedGraph


def _is_wan(module: nn.Module) -> bool:
    return instance_of(module, "diffusers.models.autoencoders.autoencoder_kl_wan", "AutoencoderKLWan")


def _wan_version(module: nn.Module) -> str:
    """Wan 2.2's VAE is the Wan class configured with residual up blocks (`is_residual`)."""
    return "wan2.2" if getattr(module.config, "is_residual", False) else "wan2.1"


def _runner() -> type:
    from rewrite.models.wan.runner import WanRunner

    return WanRunner


def _capture_encoder(module: nn.Module, dtype: torch.dtype, device: torch.device) -> list[CapturedGraph]:
    from rewrite.models.wan.encoder_capture import capture_wan_encoder

    return list(capture_wan_encoder(module.encoder, dtype, device))


#: the encoder's step graphs (`rewrite.models.wan.encoder_capture`), for the tools; the same for Qwen-Image's
ENCODER = EncoderCapture(capture_graphs=_capture_encoder, graph_names=("encode_chunk0", "encode_steady"),
                         input_dims=("batch", "channels", "frames", "height", "width"))


def _row(version: str, label: str) -> SupportedModel:
    def make(config: str, seed: int) -> nn.Module:
        from rewrite.models.wan.config import build_wan

        return build_wan(version, config, seed=seed)

    def capture(module: nn.Module, dtype: torch.dtype, device: torch.device) -> list[CapturedGraph]:
        from rewrite.models.wan.capture import capture_wan_decoder

        return list(capture_wan_decoder(module.decoder, dtype, device))

    return SupportedModel(
        name=version, family="wan", type_name="diffusers.AutoencoderKLWan", label=label,
        load_runner=_runner,
        recognise=lambda module: _is_wan(module) and _wan_version(module) == version,
        make=make, capture_graphs=capture, graph_names=("chunk0", "steady"),
        latent_dims=("batch", "channels", "frames", "height", "width"), encoder=ENCODER)


ROWS: tuple[SupportedModel, ...] = (_row("wan2.1", "Wan 2.1"), _row("wan2.2", "Wan 2.2"))
