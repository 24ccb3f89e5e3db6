"""Wan 2.1 / 2.2 VAE configurations (full size and tiny) and a random-init builder for tools and tests.

Random initialisation only: nothing is downloaded. `perturb_norms` moves the RMS-norm gammas away from 1
so that a test comparing two decoders would notice a dropped or misplaced norm scale.
"""

from __future__ import annotations

import torch

WAN_VERSIONS = ("wan2.1", "wan2.2")
SIZES = ("full", "tiny")


def wan_config(version: str, size: str = "full") -> dict:
    """`AutoencoderKLWan(**config)` keyword arguments for a version ("wan2.1"/"wan2.2") and size."""
    if version not in WAN_VERSIONS:
        raise ValueError(f"unknown Wan version {version!r}; expected one of {', '.join(WAN_VERSIONS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")
    if version == "wan2.1":
        config = dict(base_dim=96, z_dim=16)
        if size == "tiny":
            config.update(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1)
    else:
        config = dict(
            base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, patch_size=2,
            in_channels=12, out_channels=12, scale_factor_spatial=16,
        )
        if size == "tiny":
            config.update(base_dim=8, decoder_base_dim=16, z_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1)
    z_dim = config["z_dim"]
    config.update(latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim)
    return config


def build_wan(version: str, size: str = "full", *, seed: int = 0, perturb_norms: bool = True):
    """A random-init `AutoencoderKLWan` in eval mode (deterministic for a seed)."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(**wan_config(version, size)).eval()
    if perturb_norms:
        perturb_norm_gammas(vae, seed)
    return vae


def perturb_norm_gammas(vae: torch.nn.Module, seed: int) -> None:
    """Move every RMS-norm gamma away from 1 (seeded): a random-init norm's gamma of ones would hide a kernel
    that drops or misplaces it."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if name.endswith(".gamma"):
                param.add_(0.2 * torch.randn(param.shape, generator=generator))


def latent_shape(vae, batch: int, frames: int, height: int, width: int) -> tuple[int, ...]:
    """[batch, z_dim, frames, height, width] for a Wan VAE."""
    return (batch, vae.config.z_dim, frames, height, width)
