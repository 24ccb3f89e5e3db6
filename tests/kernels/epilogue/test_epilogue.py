"""The conv epilogue kernel: a conv's bias, its residual and the residual's own deferred bias added with ATen's
roundings, into the layout the replaced conv gives: `torch.equal` (CPU under the Triton interpreter, and CUDA)."""

from __future__ import annotations

import pytest
import torch

from rewrite.kernels.epilogue import epilogue as triton_epilogue
from tests.kernels.norm.test_rms_norm import DEVICE, DTYPES, _frame_major, needs_kernels


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bias,residual,residual_bias", [(True, True, False), (True, False, False),
                                                        (False, True, False), (False, False, False),
                                                        (True, True, True), (False, True, True)])
@pytest.mark.parametrize("out_layout", ("contiguous", "frame_major"))
def test_conv_epilogue_adds_with_atens_roundings(dtype, bias, residual, residual_bias, out_layout):
    """Bias, residual and the residual's own deferred bias (a shortcut conv output without it) added with the
    roundings of ATen's `y.add_(bias)`, `r.add_(r_bias)` and `y + r`."""
    g = torch.Generator().manual_seed(3)
    shape = (2, 70, 3, 5, 13)
    y = torch.randn(shape, generator=g).to(DEVICE, dtype).contiguous(memory_format=torch.channels_last_3d)
    b = torch.randn(shape[1], generator=g).to(DEVICE, dtype) if bias else None
    r = torch.randn(shape, generator=g).to(DEVICE, dtype) if residual else None
    rb = torch.randn(shape[1], generator=g).to(DEVICE, dtype) if residual_bias else None
    if r is not None and out_layout == "frame_major":
        r = _frame_major(r)
    expected = y.contiguous() if b is None else y.contiguous().add_(b.view(1, -1, 1, 1, 1))
    full_residual = r if rb is None else r + rb.view(1, -1, 1, 1, 1)
    expected = expected + full_residual if r is not None else expected
    strides = expected.stride() if out_layout == "contiguous" else _frame_major(expected).stride()
    actual = triton_epilogue.conv_epilogue(y, b, r, strides, residual_bias=rb)
    assert actual.stride() == tuple(strides)
    assert torch.equal(actual, expected)
