"""Decode driver for an optimized `AutoencoderKLQwenImage` (Qwen-Image's VAE): the Wan runner as it is.

`QwenImageRunner` is `rewrite.models.wan.runner.WanRunner` under its own `model_name` (its disk-cache entries are
keyed apart from Wan's). Everything else is Wan's: the decoder is captured by `rewrite.models.wan.capture` (which
reads the family's classes from the decoder's module), rewritten by the Wan patterns at the chosen level, and
replayed frame by frame (one frame for an image) from CUDA graphs; `_decode`'s clamp, tiling (diffusers'
`tiled_decode`, whose decoder calls the graphs serve), slicing, the guards and their logged fallbacks to
diffusers' own `_decode` are the Wan runner's. Exactness: `lossless` is `torch.equal` to diffusers' decode
(bf16, fp16, fp32); `channels_last` keeps the Wan contract. Not served: a sharded decode (`group=`: the band
forwards are written against Wan's classes) and `rewrite.stream` sessions (Wan only).

Importing this module registers `rewrite.models.qwenimage.config.WAN_EQUIVALENTS` as module-type aliases, so the Wan
patterns' provenance checks and `rewrite-debug` see a `QwenImageResidualBlock` as the `WanResidualBlock` it is,
and the decoder's module with the Wan capture (`add_decoder_family`).
"""

from __future__ import annotations

from rewrite.engine.matcher import MODULE_TYPE_ALIASES
from rewrite.models.qwenimage.config import DIFFUSERS_MODULE, WAN_EQUIVALENTS
from rewrite.models.wan.capture import add_decoder_family
from rewrite.models.wan.runner import WanRunner

MODULE_TYPE_ALIASES.update(WAN_EQUIVALENTS)
add_decoder_family(DIFFUSERS_MODULE, "QwenImage")


class QwenImageRunner(WanRunner):
    """`WanRunner` for `AutoencoderKLQwenImage` (module docstring)."""

    model_name = "qwenimage"
    shards = False  # `optimize(..., group=)` is refused: the band forwards are Wan's classes'


def capture_qwenimage(vae, dtype, device):
    """The decoder's (chunk0, steady) graphs before any pass, as the runner captures them (for the tools)."""
    from rewrite.models.wan.capture import capture_wan_decoder

    return list(capture_wan_decoder(vae.decoder, dtype, device))
