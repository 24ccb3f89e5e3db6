"""`rewrite::pointwise_conv3d`: the 1x1x1 shortcut conv of a frame-major input, run as conv2d over the frames."""

from __future__ import annotations

import pytest
import torch

from rewrite.ops import selftest
from rewrite.models.wan import ops

pointwise = torch.ops.rewrite.pointwise_conv3d


def _frame_major(shape, dtype, device, seed=0):
    b, c, t, h, w = shape
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn((b, t, c, h, w), generator=generator).to(dtype).to(device)
    return x.permute(0, 2, 1, 3, 4)  # [b, c, t, h, w] view of frame-major memory


def _operands(c_in, c_out, dtype, device, seed=1):
    generator = torch.Generator().manual_seed(seed)
    weight = (torch.randn((c_out, c_in, 1, 1, 1), generator=generator) * c_in ** -0.5).to(dtype).to(device)
    bias = torch.randn(c_out, generator=generator).to(dtype).to(device)
    return weight, bias


@pytest.mark.parametrize("with_bias", (True, False))
def test_cpu_runs_the_replaced_ops_and_returns_frame_major(with_bias):
    x = _frame_major((1, 6, 3, 5, 7), torch.float32, "cpu")
    weight, bias = _operands(6, 4, torch.float32, "cpu")
    bias = bias if with_bias else None
    out = pointwise(x, weight, bias)
    assert torch.equal(out, ops.pointwise_conv3d_reference(x, weight, bias))
    assert out.permute(0, 2, 1, 3, 4).is_contiguous()  # the layout the fake promises


def test_contiguous_input_keeps_the_reference_layout():
    x = _frame_major((2, 6, 3, 5, 7), torch.float32, "cpu").contiguous()
    weight, bias = _operands(6, 4, torch.float32, "cpu")
    out = pointwise(x, weight, bias)
    reference = ops.pointwise_conv3d_reference(x, weight, bias)
    assert torch.equal(out, reference) and out.stride() == reference.stride()


@pytest.mark.parametrize("contiguous", (False, True))
def test_fake_matches_the_real_layout(contiguous):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = _frame_major((1, 6, 3, 5, 7), torch.float32, "cpu")
    x = x.contiguous() if contiguous else x
    weight, bias = _operands(6, 4, torch.float32, "cpu")
    real = pointwise(x, weight, bias)
    with FakeTensorMode() as mode:
        fake = pointwise(mode.from_tensor(x), mode.from_tensor(weight), mode.from_tensor(bias))
    assert fake.shape == real.shape and fake.stride() == real.stride()


def test_frame_conv_check_is_off_the_gpu():
    assert not selftest.frame_conv_is_exact((1, 6, 3, 5, 7), (4, 6, 1, 1, 1), torch.float32, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16, torch.float32), ids=str)
@pytest.mark.parametrize("shape, c_out", [((1, 96, 3, 37, 53), 48), ((1, 192, 2, 60, 104), 384),
                                          ((1, 512, 4, 360, 640), 256), ((1, 1024, 4, 180, 320), 512)])
def test_gpu_equals_the_ncdhw_conv(shape, c_out, dtype):
    """The conv2d path (where the self-check admits the shape) or the fallback is `torch.equal` to the ops
    it replaced; the result is frame-major either way."""
    x = _frame_major(shape, dtype, "cuda")
    weight, bias = _operands(shape[1], c_out, dtype, "cuda")
    with torch.no_grad():
        out = pointwise(x, weight, bias)
        assert torch.equal(out, ops.pointwise_conv3d_reference(x, weight, bias))
    assert out.permute(0, 2, 1, 3, 4).is_contiguous()
    admitted = selftest.frame_conv_is_exact(tuple(shape), tuple(weight.shape), dtype, x.device)
    print(f"frame-major conv2d for {list(shape)} -> {c_out} {dtype}: {'used' if admitted else 'refused'}")
