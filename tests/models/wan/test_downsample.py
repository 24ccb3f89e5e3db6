"""The encoder downsamplers' ops (`rewrite.models.wan.downsample`; `patterns/wan/pad_conv2d.py`, `time_conv.py`):
`rewrite::pad_conv2d` and `rewrite::time_conv` against the replaced ops, their self-check's gate, and the patterns
on the Wan encoders' graphs.

CPU: the reference path is `torch.equal` to ``conv2d(pad(x))``; the channels-last path runs under the Triton
interpreter with its GPU-only gate opened, within fp32 1e-5 (CPU convs of the two layouts may sum ~70 products in
other orders: a few ulp of outputs up to ~5); on the GPU they serve only shapes their self-check found exact.
"""

from __future__ import annotations

import pytest
import torch

from rewrite.models.wan import downsample
from rewrite.models.wan.config import build_wan
from rewrite.models.wan.encoder_capture import capture_wan_encoder
from rewrite.ops import selftest
from rewrite.ops.dispatch import use_backend
from rewrite.pipeline import rewrite_graph
from tests.kernels.norm.test_rms_norm import needs_interpreter
from tests.op_cases import frame_major

PAD, STRIDE = [0, 1, 0, 1], [2, 2]


def _operands(seed: int = 0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 8, 9, 12, generator=g).to(dtype)
    weight, bias = (0.2 * torch.randn(8, 8, 3, 3, generator=g)).to(dtype), torch.randn(8, generator=g).to(dtype)
    return x, weight, bias


@pytest.mark.parametrize("with_bias", (True, False))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_the_reference_path_is_the_replaced_ops(with_bias, dtype):
    x, weight, bias = _operands(1, dtype)
    bias = bias if with_bias else None
    expected = torch.nn.functional.conv2d(torch.nn.functional.pad(x, PAD), weight, bias, STRIDE)
    assert torch.equal(torch.ops.rewrite.pad_conv2d(x, PAD, weight, bias, STRIDE), expected)
    cl_weight = weight.contiguous(memory_format=torch.channels_last)  # what the runtime may pass
    assert torch.equal(torch.ops.rewrite.pad_conv2d(x, PAD, cl_weight, bias, STRIDE), expected)


@needs_interpreter
@pytest.mark.parametrize("pad", ([0, 1, 0, 1], [2, 0, 1, 3]))
def test_the_channels_last_pad_is_atens_pad(pad):
    x = _operands(2)[0]
    padded = downsample._padded_channels_last(x, pad)
    assert padded.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(padded, torch.nn.functional.pad(x, pad))


@needs_interpreter
def test_the_channels_last_join_is_atens_cat():
    x, cache = _time_conv_operands()[:2]
    cache = torch.cat([torch.randn_like(cache), cache], 2)  # two frames: only the last joins
    joined = downsample._joined_channels_last(x, cache)
    assert joined.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(joined, torch.cat([cache[:, :, -1:], x], 2))


def test_the_self_check_is_off_the_gpu():
    assert not selftest.strided_channels_last_conv_is_exact((3, 8, 10, 13), (8, 8, 3, 3), (2, 2), torch.float32,
                                                            torch.device("cpu"))


def _both_paths(monkeypatch, writer: str, op, *args):
    """(reference path's result, channels-last path's result) of `op(*args)`, the GPU-only self-check opened;
    asserts that the channels-last path ran (its input `writer` was called once)."""
    monkeypatch.setattr(selftest, "strided_channels_last_conv_is_exact", lambda *_args, **_kwargs: True)
    served, original = [], getattr(downsample, writer)
    monkeypatch.setattr(downsample, writer, lambda *a: served.append(1) or original(*a))
    with use_backend("reference"):
        expected = op(*args)
    with use_backend("triton"):
        actual = op(*args)
    assert served == [1]
    return expected, actual


@needs_interpreter
def test_the_channels_last_path_on_cpu(monkeypatch):
    x, weight, bias = _operands(3)
    expected, actual = _both_paths(monkeypatch, "_padded_channels_last", torch.ops.rewrite.pad_conv2d, x, PAD, weight,
                                   bias, STRIDE)
    assert actual.shape == expected.shape and actual.stride() == expected.stride()
    assert torch.allclose(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("version", ("wan2.1", "wan2.2"))
def test_the_pattern_takes_every_encoder_downsampler(version):
    encoder = build_wan(version, "tiny").encoder
    for graph in capture_wan_encoder(encoder, torch.float32, torch.device("cpu")):
        rewrite_graph(graph, "lossless")
        targets = [n.target for n in graph.graph_module.graph.nodes if n.op == "call_function"]
        assert targets.count(torch.ops.rewrite.pad_conv2d.default) == 3  # one per downsampling stage
        assert targets.count(torch.ops.rewrite.time_conv.default) == (2 if graph.name == "encode_steady" else 0)
        assert torch.ops.aten.conv3d.default not in targets  # chunk 0 stores its frame; later chunks convolve
        assert torch.ops.aten.pad.default not in targets or all(
            n.args[1] != PAD for n in graph.graph_module.graph.nodes if n.target == torch.ops.aten.pad.default)


def _time_conv_operands(seed: int = 4, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 6, 4, 5, 7, generator=g).to(dtype).permute(0, 2, 1, 3, 4).contiguous().permute(0, 2, 1, 3, 4)
    cache = torch.randn(2, 6, 1, 5, 7, generator=g).to(dtype)
    weight, bias = (0.3 * torch.randn(6, 6, 3, 1, 1, generator=g)).to(dtype), torch.randn(6, generator=g).to(dtype)
    return x, cache, weight, bias  # x frame-major, as the spatial downsample leaves it


@pytest.mark.parametrize("with_bias", (True, False))
def test_time_conv_reference_is_the_replaced_ops(with_bias):
    x, cache, weight, bias = _time_conv_operands()
    bias = bias if with_bias else None
    y, next_cache = torch.ops.rewrite.time_conv(x, cache, [0] * 6, weight, bias, [2, 1, 1])
    joined = torch.cat([cache[:, :, -1:], x], 2)
    assert torch.equal(y, torch.nn.functional.conv3d(torch.nn.functional.pad(joined, [0] * 6), weight, bias, [2, 1, 1]))
    assert torch.equal(next_cache, x[:, :, -1:].clone()) and next_cache.stride() == x[:, :, -1:].clone().stride()


@needs_interpreter
def test_time_conv_channels_last_path_on_cpu(monkeypatch):
    x, cache, weight, bias = _time_conv_operands(5)
    expected, actual = _both_paths(monkeypatch, "_joined_channels_last", torch.ops.rewrite.time_conv, x, cache,
                                   [0] * 6, weight, bias, [2, 1, 1])
    assert actual[0].shape == expected[0].shape and actual[0].stride() == expected[0].stride()
    assert torch.allclose(actual[0], expected[0], rtol=1e-5, atol=1e-5)  # see the module docstring
    assert torch.equal(actual[1], expected[1]) and actual[1].stride() == expected[1].stride()


# ---- Wan 2.2's AvgDown3D shortcut and the down block's add (`rewrite::avg_down_add`, level lossless) ---------------
def _avg_down_operands(factor_t, factor_s, out_channels, frames, dtype=torch.float32, seed=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, frames, 6, 10, generator=g).to(dtype)
    t_out = (frames + (factor_t - frames % factor_t) % factor_t) // factor_t
    main = torch.randn(2, out_channels, t_out, 6 // factor_s, 10 // factor_s, generator=g).to(dtype)
    return frame_major(main), x  # as the downsamplers leave it


def _avg_down_args(module, x):
    """The op's (pad, unfold, channels, fold) for diffusers' `module` on x, as its forward builds them."""
    pad_t = (module.factor_t - x.shape[2] % module.factor_t) % module.factor_t
    b, c, t, h, w = x.shape[0], x.shape[1], x.shape[2] + pad_t, x.shape[3], x.shape[4]
    ft, fs = module.factor_t, module.factor_s
    unfold = [b, c, t // ft, ft, h // fs, fs, w // fs, fs]
    return ([0, 0, 0, 0, pad_t, 0], unfold, [b, c * module.factor, t // ft, h // fs, w // fs],
            [b, module.out_channels, module.group_size, t // ft, h // fs, w // fs])


AVG_DOWNS = [(1, 2, 16, 4), (2, 2, 16, 4), (2, 2, 16, 1), (2, 2, 8, 4), (1, 1, 8, 4)]  # factor_t, factor_s, out, frames


@pytest.mark.parametrize("factor_t,factor_s,out_channels,frames", AVG_DOWNS)
def test_avg_down_add_reference_is_diffusers_shortcut_and_add(factor_t, factor_s, out_channels, frames):
    from diffusers.models.autoencoders.autoencoder_kl_wan import AvgDown3D

    module = AvgDown3D(8, out_channels, factor_t, factor_s)
    main, x = _avg_down_operands(factor_t, factor_s, out_channels, frames, torch.bfloat16)
    expected = main + module(x)
    with use_backend("reference"):
        actual = torch.ops.rewrite.avg_down_add(main, x, *_avg_down_args(module, x))
    assert torch.equal(actual, expected) and actual.stride() == expected.stride()


@needs_interpreter
@pytest.mark.parametrize("factor_t,factor_s,out_channels,frames", AVG_DOWNS)
def test_avg_down_add_kernel_path_on_cpu(factor_t, factor_s, out_channels, frames):
    """The kernel path against diffusers in fp32: the group's sum in another order than ATen's CPU mean, within
    fp32's rounding of a sum of at most 8 values (`assert_close`'s fp32 defaults, rtol 1.3e-6, atol 1e-5)."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import AvgDown3D

    module = AvgDown3D(8, out_channels, factor_t, factor_s)
    main, x = _avg_down_operands(factor_t, factor_s, out_channels, frames)
    expected = main + module(x)
    with use_backend("triton"):
        actual = torch.ops.rewrite.avg_down_add(main, x, *_avg_down_args(module, x))
    torch.testing.assert_close(actual, expected)
    assert actual.stride() == expected.stride()


@pytest.mark.parametrize("version,level,expected", [("wan2.2", "channels_last", 3), ("wan2.2", "lossless", 3),
                                                    ("wan2.1", "channels_last", 0)])
def test_the_avg_down_pattern_takes_wan22s_down_block_ends(monkeypatch, version, level, expected):
    """On a CPU capture of the tiny encoder standing in for a CUDA one (the interpreter's gate opened): the three
    down blocks that downsample end in the op at both levels (the last block's shortcut, which unfolds nothing,
    has no permuted copy to spare and keeps its ops); Wan 2.1 has no shortcut."""
    from rewrite.ops import dispatch

    monkeypatch.setattr(dispatch, "INTERPRETING", True)
    monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *a, **k: True)
    encoder = build_wan(version, "tiny").to(torch.bfloat16).encoder
    for graph in capture_wan_encoder(encoder, torch.bfloat16, torch.device("cpu")):
        rewrite_graph(graph, level)
        targets = [n.target for n in graph.graph_module.graph.nodes if n.op == "call_function"]
        assert targets.count(torch.ops.rewrite.avg_down_add.default) == expected
        assert targets.count(torch.ops.aten.mean.dim) == (4 if version == "wan2.2" else 0) - expected


def test_the_shortcut_ops_arguments_rebuild_diffusers_encode(monkeypatch):
    """Wan 2.2's tiny encoder optimized at ``channels_last`` with the shortcut op in both step graphs (gates opened
    as on a GPU), then run on every op's reference path: `torch.equal` to diffusers, so the pad, unfold and group
    shapes the pattern hands the op are the replaced views' (the kernel reads its factors from the same shapes)."""
    import copy

    from rewrite import optimize, report
    from rewrite.ops import dispatch

    monkeypatch.setattr(dispatch, "INTERPRETING", True)
    monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *a, **k: True)
    vae = build_wan("wan2.2", "tiny").to(torch.bfloat16)
    reference = copy.deepcopy(vae)
    video = torch.randn(1, 3, 9, 32, 48, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    optimize(vae, level="channels_last")
    with torch.no_grad(), use_backend("reference"):
        actual, expected = vae.encode(video).latent_dist, reference.encode(video).latent_dist
    assert torch.equal(actual.mean, expected.mean) and torch.equal(actual.logvar, expected.logvar)
    assert str(report(vae)).count("avg_down_add[padded=True]=3") == 2  # chunk 0's graph and the steady one's
