"""`rewrite.models.wan.distributed` bands, in process: the rows each rank decodes and the position check."""

from __future__ import annotations

import torch


def test_split_rows_uneven_and_output_rows():
    from rewrite.models.wan.distributed import output_rows, split_rows
    from rewrite.models.wan.config import build_wan

    assert split_rows(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert split_rows(4, 3) == [(0, 2), (2, 3), (3, 4)]
    assert split_rows(6, 2) == [(0, 3), (3, 6)]
    vae = build_wan("wan2.1", "tiny")
    assert output_rows(vae, 5, 2) == [(0, 24), (24, 40)]


def test_position_check_finds_cpu_silu_tails():
    import torch.nn.functional as F

    from rewrite.models.wan.distributed.bands import position_independent

    ok, reason = position_independent(F.silu, torch.float16, torch.device("cpu"))
    assert ok, reason
    # the identity is trivially position independent; ATen's fp32 SiLU on AVX CPUs is not (exp differs
    # between its vectorized body and its scalar tail): either verdict is a property of the machine
    assert position_independent(lambda t: t.clone(), torch.float32, torch.device("cpu"))[0]
