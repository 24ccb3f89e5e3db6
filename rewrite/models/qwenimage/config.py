"""Qwen-Image's VAE (diffusers `AutoencoderKLQwenImage`): configurations, a random-init builder, and the table that
names its decoder's classes after their Wan 2.1 counterparts.

What it is: Qwen-Image's VAE is the Wan 2.1 video VAE fine-tuned, and diffusers defines it as a copy of the Wan
2.1 code path under other class names (`QwenImageCausalConv3d`, `QwenImageRMS_norm`, `QwenImageResample`, ...):
the same decoder blocks, the same per-frame cache protocol, the same clamp at the end of `_decode`. Its config
has no Wan 2.2 keys (`is_residual`, `patch_size`, `decoder_base_dim`, `out_channels`: the output channels are
`input_channels`), and the decoder's forward takes no `first_chunk`. Its images are one latent frame
(`[batch, 16, 1, height/8, width/8]`); more frames decode as a Wan 2.1 clip (1 + 4 (frames - 1) frames).
So the Wan capture (`rewrite.models.wan.capture`, which reads the family's classes from the decoder's module), the Wan
patterns and kernels (the ATen graphs are the same) and the Wan runner (`QwenImageRunner`, `rewrite.models.qwenimage.runner`)
serve it; the levels keep the Wan contract (README, "Levels and their contracts").

`WAN_EQUIVALENTS` maps each decoder class to its Wan class, for the patterns' module-type checks
(`rewrite.engine.matcher.MODULE_TYPE_ALIASES`, filled when `rewrite.models.qwenimage.runner` is imported).

Random initialisation only: nothing is downloaded. `perturb_norms` moves the RMS-norm gammas away from 1 (as
`rewrite.models.wan.config.build_wan` does).
"""

from __future__ import annotations

import torch

from rewrite.models.wan.config import perturb_norm_gammas

SIZES = ("full", "tiny")

#: the diffusers module that defines the family
DIFFUSERS_MODULE = "diffusers.models.autoencoders.autoencoder_kl_qwenimage"

#: Qwen-Image decoder class -> the Wan class that computes the same ATen graph
WAN_EQUIVALENTS = {f"QwenImage{role}": f"Wan{role}" for role in (
    "CausalConv3d", "RMS_norm", "Upsample", "Resample", "ResidualBlock", "AttentionBlock", "MidBlock", "UpBlock",
    "Decoder3d")}


def qwenimage_config(size: str = "full") -> dict:
    """`AutoencoderKLQwenImage(**config)` keyword arguments. "full" is the geometry diffusers defines (its
    defaults: the published Qwen-Image VAE's config, latents_mean/std included); "tiny" the Wan 2.1 tiny
    geometry (base_dim 8, z_dim 4, one residual block per stage) for CPU tests."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")
    config = dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                  temperal_downsample=[False, True, True], dropout=0.0, input_channels=3)
    if size == "tiny":
        config.update(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                      latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    return config


def build_qwenimage(size: str = "full", *, seed: int = 0, perturb_norms: bool = True):
    """A random-init `AutoencoderKLQwenImage` in eval mode (deterministic for a seed)."""
    from diffusers import AutoencoderKLQwenImage

    torch.manual_seed(seed)
    vae = AutoencoderKLQwenImage(**qwenimage_config(size)).eval()
    if perturb_norms:
        perturb_norm_gammas(vae, seed)
    return vae


def latent_shape(vae, batch: int, height: int, width: int, frames: int = 1) -> tuple[int, ...]:
    """[batch, z_dim, frames, height, width]: one frame for an image."""
    return (batch, vae.config.z_dim, frames, height, width)
