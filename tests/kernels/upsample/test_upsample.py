"""The channels-last nearest-exact 2x upsample kernel: pure data movement, `torch.equal` to the ATen reference
(CPU under the Triton interpreter, and CUDA)."""

from __future__ import annotations

import pytest
import torch

from rewrite.kernels.upsample import upsample as triton_upsample
from rewrite.kernels.upsample.reference import upsample_nearest2x_reference
from tests.kernels.norm.test_rms_norm import DEVICE, DTYPES, needs_kernels


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("contiguous", "frames_of_ncdhw"))
def test_channels_last_upsample_is_exact(dtype, layout):
    x = torch.randn(3, 70, 5, 7, generator=torch.Generator().manual_seed(6)).to(DEVICE, dtype)
    if layout == "frames_of_ncdhw":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    actual = triton_upsample.upsample_nearest2x_channels_last(x)
    assert actual.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(actual, upsample_nearest2x_reference(x, False))
