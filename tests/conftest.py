"""Shared fixtures: tiny random-init Wan decoders (reference and optimized copies with equal weights), and
the kernel dispatch forced to Triton on CPU (`kernel_allowed_on_cpu`)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # kernel tests run under Triton's interpreter; set before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from rewrite import optimize  # noqa: E402
from rewrite.models.wan.config import build_wan  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


class WanPair:
    """A reference VAE and an optimized VAE with the same state dict, in one dtype."""

    def __init__(self, version: str, dtype: torch.dtype, level: str = "lossless"):
        self.version, self.dtype = version, dtype
        self.reference = build_wan(version, "tiny").to(dtype)
        self.optimized = optimize(build_wan(version, "tiny").to(dtype), level=level)

    def latents(self, batch: int, frames: int, height: int = 4, width: int = 6, seed: int = 0) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        shape = (batch, self.reference.config.z_dim, frames, height, width)
        return torch.randn(shape, generator=generator).to(self.dtype)

    def decode_both(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            return self.reference.decode(z).sample, self.optimized.decode(z).sample


_PAIRS: dict = {}


@pytest.fixture(scope="session")
def wan_pair():
    """`wan_pair(version, dtype)`: a cached WanPair (capture happens once per version and dtype)."""

    def get(version: str, dtype: torch.dtype = torch.float32) -> WanPair:
        key = (version, dtype)
        if key not in _PAIRS:
            _PAIRS[key] = WanPair(version, dtype)
        return _PAIRS[key]

    return get


@pytest.fixture
def kernel_allowed_on_cpu(monkeypatch):
    """Pretend the interpreter is on and force the kernels, so CPU calls reach the later dispatch checks."""
    from rewrite.ops import dispatch

    monkeypatch.setattr(dispatch, "INTERPRETING", True)
    with dispatch.use_backend("triton"):
        yield
