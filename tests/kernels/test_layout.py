"""`rewrite.kernels.layout`'s cached reference layouts: keys that name what was computed."""

from __future__ import annotations

import torch

from rewrite.kernels import layout


def test_the_adds_of_a_contiguous_tensor_are_cached_per_operand_order():
    """ATen's add breaks layout ties by operand order; both orders are asked for the same tensors (a causal conv's
    output with its residual, a shortcut added to its main path), so each must be cached under its own key."""
    frame_major = torch.randn(1, 4, 3, 5, 6).transpose(1, 2).contiguous().transpose(1, 2)
    contiguous = torch.empty_like(frame_major, memory_format=torch.contiguous_format)
    first = layout.add_contiguous_layout(frame_major, contiguous_first=True)
    second = layout.add_contiguous_layout(frame_major, contiguous_first=False)
    assert first == (contiguous + frame_major).stride() == contiguous.stride()
    assert second == (frame_major + contiguous).stride() == frame_major.stride()
    assert layout.conv_output_strides(list(frame_major.shape), frame_major) == first
