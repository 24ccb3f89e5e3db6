"""`rewrite.kernels.norm.aten_reduction`: the plan of ATen's norm reduction (a transcription of setReduceConfig) and
ATen's 32-bit pieces of inputs of 2 GiB and more, which the one-kernel RMS norm follows."""

from __future__ import annotations

import pytest
import torch

from rewrite.kernels.norm import aten_reduction


# ---- the plan: a transcription of setReduceConfig, checked on known configurations ----------------------
@pytest.mark.parametrize("outputs,channels,vec,expected", [
    (6240, 384, 4, (4, 1)),     # Wan 2.1 480p lowest stage: 4 warps split the channels
    (1597440, 96, 4, (4, 1)),   # Wan 2.1 480p last stage, 4 frames
    (3600, 1024, 4, (4, 16)),   # Wan 2.2 720p 1024 channels over few outputs: split across 16 blocks too
    (28800, 1024, 4, (4, 10)),  # two frames at 90 x 160: 10 blocks
    (230400, 1024, 4, (4, 2)),  # four frames at 180 x 320: 2 blocks
    (1683, 384, 1, (16, 1)),    # odd width: no vectorized outputs, 16 warps
    (63, 40, 1, (1, 1)),        # few channels: one thread per output
])
def test_split_follows_set_reduce_config(outputs, channels, vec, expected):
    assert aten_reduction.split_for(outputs, channels, vec, multiprocessors=132, threads_per_mp=2048) == expected


def test_output_vec_size_reads_alignment_and_strides():
    assert aten_reduction.output_vec_size((1, 96, 4, 60, 104), (2396160, 24960, 6240, 104, 1), 0, 4) == 4
    assert aten_reduction.output_vec_size((1, 96, 1, 7, 9), (6048, 63, 63, 9, 1), 0, 4) == 1
    assert aten_reduction.output_vec_size((1, 8, 1, 2, 3), (48, 6, 6, 3, 1), 0, 4) == 2
    assert aten_reduction.output_vec_size((1, 96, 4, 60, 104), (2396160, 24960, 6240, 104, 1), 8, 4) == 2


def test_plan_is_none_off_cuda():
    assert aten_reduction.plan(torch.randn(1, 8, 1, 4, 4), torch.float32) is None


# ---- inputs of 2 GiB and more: ATen's 32-bit pieces ---------------------------------------------------
def _contiguous(shape):
    return aten_reduction._contiguous_strides(shape)


def _frame_major_strides(shape):
    b, c, t, h, w = shape
    return (t * c * h * w, h * w, c * h * w, w, 1)


@pytest.mark.parametrize("shape,strides,expected", [
    # Wan 2.1 1088x1920, last stage (fp32 copy 3.2 GB): two 48-channel pieces, one thread per output each
    ((1, 96, 4, 1088, 1920), _contiguous((1, 96, 4, 1088, 1920)), aten_reduction.NormPlan(1, 4, 1, (48,))),
    ((2, 96, 4, 1088, 1920), _contiguous((2, 96, 4, 1088, 1920)), aten_reduction.NormPlan(1, 4, 1, (48,))),
    ((1, 256, 4, 1088, 1920), _contiguous((1, 256, 4, 1088, 1920)), aten_reduction.NormPlan(4, 4, 1, (64, 128, 192))),
    ((1, 512, 4, 1088, 1920), _contiguous((1, 512, 4, 1088, 1920)), None),  # eight pieces: more than kept
    # batches and frames are split first where they are the slower dims: whole channels, pieces of outputs
    ((3, 96, 4, 720, 1280), _contiguous((3, 96, 4, 720, 1280)), aten_reduction.NormPlan(4, 4, 1)),
    ((1, 96, 4, 1088, 1920), _frame_major_strides((1, 96, 4, 1088, 1920)), aten_reduction.NormPlan(4, 4, 1)),
], ids=str)
def test_inputs_past_32_bit_indexing_take_atens_pieces(monkeypatch, shape, strides, expected):
    monkeypatch.setattr(aten_reduction, "_device_limits", lambda index: (132, 2048))  # an H100 / H200
    assert aten_reduction._max_offset(shape, strides, 4) > aten_reduction.INT32_MAX
    assert aten_reduction.split_plan(shape, strides, 0, 4, 0) == expected


def test_32_bit_pieces_are_halves_of_the_widest_dim_first_half_first():
    dims = aten_reduction._iterator_dims((3, 96, 4, 720, 1280), _contiguous((3, 96, 4, 720, 1280)), 4)
    assert [d.size for d in dims] == [96, 4 * 720 * 1280, 3]  # channels first, (t, h, w) coalesced, batch
    pieces = aten_reduction.split_pieces(dims)
    assert [ranges[2] for ranges in pieces] == [(0, 1), (1, 1), (2, 1)]  # 1 then 2 = 1 + 1 batches
    assert all(ranges[:2] == ((0, 96), (0, 4 * 720 * 1280)) for ranges in pieces)
    wide = aten_reduction._iterator_dims((1, 200, 4, 1088, 1920), _contiguous((1, 200, 4, 1088, 1920)), 4)
    assert [ranges[0] for ranges in aten_reduction.split_pieces(wide)] == [(0, 50), (50, 50), (100, 50), (150, 50)]
