"""The Wan ``channels_last`` norm + conv ops around the Triton conv3d kernel (its own tests:
`tests/kernels/conv3d/test_conv3d.py`): the fused op, the pair op, and their routing. A shape the kernel does
not serve runs the ``lossless`` op, `torch.equal` to it; where it serves, the tolerance is the kernel's (one
output ulp plus the recursive-summation bound, `tests.ulps.within_one_ulp`).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from rewrite.ops import dispatch, selftest
from rewrite.kernels import layout
from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.norm import one_pass as triton_norm_fast
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.models.wan import ops as _wan_ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.ops.dispatch import INTERPRETING, use_backend
from rewrite.kernels.conv3d.conv3d import ConvTile
from tests import quick
from tests.captures import tiny_wan
from tests.op_cases import kernel_gates_open, norm_plan_on_cpu
from tests.ulps import ulp, within_one_ulp

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")
CL = torch.channels_last_3d
SMALL = ConvTile(32, 32, 16, 4, 2)  # small tiles keep the interpreter fast


# ---- the fused op ------------------------------------------------------------------------------------------
def _op_inputs(c, o, dtype, mode="steady_t1", residual=True, seed=1):
    g = torch.Generator().manual_seed(seed)
    frames = 2 if mode == "steady" else 1
    x = torch.randn(1, c, frames, 3, 19, generator=g).to(dtype).to(DEVICE)
    gamma = (1 + 0.1 * torch.randn(c, 1, 1, 1, generator=g)).to(dtype).to(DEVICE)
    cache = None if mode == "chunk0" else torch.randn(1, c, 2, 3, 19, generator=g).to(dtype).to(DEVICE)
    weight = (torch.randn(o, c, 3, 3, 3, generator=g) / (27 * c) ** 0.5).to(dtype).to(DEVICE)
    bias = torch.randn(o, generator=g).to(dtype).to(DEVICE)
    res = torch.randn(1, o, frames, 3, 19, generator=g).to(dtype).to(DEVICE) if residual else None
    pad = [1, 1, 1, 1, 2, 0] if mode == "chunk0" else [1, 1, 1, 1, 0, 0]  # the cache supplies the causal frames
    return (x, gamma, c ** 0.5, 0.0, 1e-12, True, "silu", cache, pad, mode, weight, bias, res)


@pytest.fixture
def served_16_channels(monkeypatch):
    """Let the router pick the kernel for 16 -> 16 channel convs (tiny shapes) with small tiles."""
    monkeypatch.setattr(triton_conv3d, "_FASTER_THAN_CUDNN", {(16, 16, 27): math.inf})
    monkeypatch.setattr(triton_conv3d, "launch_config", lambda c, o, w=None, *_, **__: SMALL)


@needs_kernels
@pytest.mark.parametrize("mode", ["steady_t1", "chunk0", "steady"])
@pytest.mark.parametrize("residual", [True, False])
def test_fast_op_is_the_lossless_op_up_to_its_rounding(served_16_channels, kernel_allowed_on_cpu, monkeypatch, mode,
                                                       residual):
    """On CUDA against the reference ops (the exact norm kernel is ATen's norm bit for bit); on the CPU, where
    the exact norm has no plan of ATen's CUDA order, both ops take their kernel paths with the CPU plan
    (`tests.op_cases`), so they share the norm kernel and differ by their convs only."""
    if not CUDA:
        monkeypatch.setattr(layout, "norm_plan", norm_plan_on_cpu)
        monkeypatch.setattr(selftest, "silu_is_exact", lambda *a, **k: True)
        monkeypatch.setattr(selftest, "channels_last_conv_is_exact", lambda *a, **k: True)
    ran = []
    original = triton_conv3d.conv3d_channels_last
    monkeypatch.setattr(triton_conv3d, "conv3d_channels_last", lambda *a, **k: ran.append(1) or original(*a, **k))
    args = _op_inputs(16, 16, torch.bfloat16, mode, residual)
    assert wan_fast._route(args[0], args[7], args[8], args[9], args[10], args[12])[2]  # the direct conv
    fast, fast_cache = torch.ops.rewrite.rms_norm_causal_conv3d_fast(*args)
    assert ran  # the kernel path ran
    with use_backend("reference" if CUDA else "triton"):
        exact, exact_cache = torch.ops.rewrite.rms_norm_causal_conv3d(*args)
    assert torch.equal(fast_cache, exact_cache)  # the norm kernel's cache: unchanged by the conv
    assert fast.stride() == exact.stride()
    # The lossless op rounds the conv, the bias add and the residual add (half an ulp each, of values no larger
    # than M = |out| + |bias| + |residual|); this op rounds once: four half-ulps of M at most apart.
    _, _, _, _, _, _, _, _, _, _, _, bias, residual = args
    magnitude = torch.maximum(exact.double().abs(), fast.double().abs()) + bias.double().abs().view(-1, 1, 1, 1)
    if residual is not None:
        magnitude = magnitude + residual.double().abs()
    error = (fast.double() - exact.double()).abs()
    bound = 2 * ulp(magnitude, torch.bfloat16)
    assert bool((error <= bound).all()), error.max()


@needs_kernels
@pytest.mark.parametrize("fold", [0, 1, 2])
def test_fast_op_serves_a_narrow_head(kernel_allowed_on_cpu, monkeypatch, fold):
    """A 16 -> 3 conv (a decoder head) on the kernel path, plain (a 16-channel tile) or folded: the conv of the
    one-pass norm's padded input within the kernel test's bound, and that norm's next cache. (On the CPU the
    exact norm kernel has no plan, so the one-pass norm is what lets the op take its kernel path here.)"""
    monkeypatch.setattr(triton_conv3d, "_FASTER_THAN_CUDNN", {(16, 3, 27): math.inf})
    monkeypatch.setattr(triton_conv3d, "_FOLDED_TAPS", {(16, 3, 27): fold} if fold else {})
    monkeypatch.setattr(triton_conv3d, "launch_config", lambda c, o, w=None, *_, **__: SMALL)
    monkeypatch.setattr(wan_fast, "_ONE_PASS_NORM_CHANNELS", frozenset({16}))
    ran = []
    for name in ("conv3d_channels_last", "conv3d_channels_last_folded"):
        original = getattr(triton_conv3d, name)
        monkeypatch.setattr(triton_conv3d, name, lambda *a, _name=name, _f=original, **k: ran.append(_name) or _f(*a, **k))
    x, gamma, scale, norm_bias, eps, _, _, cache, pad, mode, weight, bias, _ = args = _op_inputs(
        16, 3, torch.bfloat16, "steady", residual=False)
    out, next_cache = torch.ops.rewrite.rms_norm_causal_conv3d_fast(*args)
    assert ran[0] == ("conv3d_channels_last_folded" if fold else "conv3d_channels_last")
    padded, expected_cache = triton_norm_fast.rms_norm_padded_one_pass(x, gamma, scale, norm_bias, eps, True, cache,
                                                                       pad)
    assert torch.equal(next_cache, expected_cache)
    reference = F.conv3d(padded.double(), weight.double(), bias.double())
    magnitude = F.conv3d(padded.double().abs(), weight.double().abs()) + bias.double().abs().view(-1, 1, 1, 1)
    within_one_ulp(out, reference, magnitude, 27 * 16 + 1)


@needs_kernels
def test_a_chosen_conv_without_a_norm_kernel_runs_the_lossless_op_and_says_so(served_16_channels,
                                                                               kernel_allowed_on_cpu, monkeypatch,
                                                                               caplog):
    """The Triton conv is chosen for 16 -> 16 channels, but x is channels-last (the exact norm kernel has no plan
    for it, on CUDA as on the CPU) and 16 channels are not one-pass: the lossless op's answer, and one INFO line
    naming the conv and x's layout, not repeated for the next call."""
    ran = []
    monkeypatch.setattr(triton_conv3d, "conv3d_channels_last", lambda *a, **k: ran.append(1))
    wan_fast._log_no_norm_kernel.cache_clear()
    args = list(_op_inputs(16, 16, torch.bfloat16))
    args[0] = args[0].contiguous(memory_format=torch.channels_last_3d)
    assert wan_fast._route(args[0], args[7], args[8], args[9], args[10], args[12])[2]  # the direct conv
    with caplog.at_level("INFO", logger="rewrite"):
        fast, _ = torch.ops.rewrite.rms_norm_causal_conv3d_fast(*args)
        torch.ops.rewrite.rms_norm_causal_conv3d_fast(*args)
    exact, _ = torch.ops.rewrite.rms_norm_causal_conv3d(*args)
    assert not ran and torch.equal(fast, exact)
    lines = [r.getMessage() for r in caplog.records if "no norm kernel serves x" in r.getMessage()]
    assert len(lines) == 1 and "Triton conv is chosen for 16 -> 16 channels" in lines[0]
    assert str(list(args[0].stride())) in lines[0]


@needs_kernels
def test_fast_op_runs_the_lossless_op_where_the_kernel_does_not_serve(kernel_allowed_on_cpu):
    # 16 -> 16 channels is not in the measured table: the lossless op's answer, bit for bit
    args = _op_inputs(16, 16, torch.bfloat16)
    fast, _ = torch.ops.rewrite.rms_norm_causal_conv3d_fast(*args)
    exact, _ = torch.ops.rewrite.rms_norm_causal_conv3d(*args)
    assert torch.equal(fast, exact)


def test_fast_op_off_the_kernel_path_is_the_lossless_op():
    args = _op_inputs(16, 16, torch.float32)  # CPU, auto backend: no kernel
    fast, fast_cache = torch.ops.rewrite.rms_norm_causal_conv3d_fast(*args)
    exact, exact_cache = torch.ops.rewrite.rms_norm_causal_conv3d(*args)
    assert torch.equal(fast, exact) and torch.equal(fast_cache, exact_cache)


def test_report_names_why_the_fast_conv_was_declined():
    from rewrite import optimize, report
    from rewrite.models.wan.config import build_wan

    vae = optimize(build_wan("wan2.1", "tiny").to(torch.bfloat16), level="channels_last")
    with torch.no_grad():
        vae.decode(torch.randn(1, vae.config.z_dim, 2, 4, 6).to(torch.bfloat16))
    graphs = report(vae).graphs
    declined = [g.declined.get("rms_norm_causal_conv3d_fast", {}) for g in graphs]
    expected = "runs on CUDA" if not INTERPRETING else "cuDNN's conv measured faster"  # the guard's first objection
    assert all(any(expected in reason for reason in reasons) for reasons in declined), declined
    assert "declined x" in str(report(vae))


# ---- the pair op: the second norm in the first conv's epilogue ---------------------------------------------
def _pair_inputs(mode, residual, residual_bias, dtype=torch.bfloat16, c=16, seed=3, h=3, w=19):
    """Inputs on which the first conv's output is exact: x has one non-zero channel per pixel, so the first
    norm (no activation, scale 1, gamma 1) gives +-1 exactly; the first weight is in {-1, 0, 1} and its bias
    an integer, so the first conv's sums (at most 27 + 4 in magnitude) and its biased output are exact in
    every order and rounding, on both paths."""
    g = torch.Generator().manual_seed(seed)
    frames = 2 if mode == "steady" else 1

    def one_hot(*shape):
        index = torch.randint(0, c, shape, generator=g)
        signs = torch.randint(0, 2, shape, generator=g).to(torch.float32) * 2 - 1
        magnitude = torch.rand(shape, generator=g) + 0.5
        t = torch.nn.functional.one_hot(index, c).movedim(-1, 1).to(torch.float32) * (signs * magnitude).unsqueeze(1)
        return t.to(dtype).to(DEVICE).contiguous()

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(dtype).to(DEVICE)

    x = one_hot(1, frames, h, w)
    cache = None if mode == "chunk0" else torch.sign(one_hot(1, 2, h, w))  # a normalized cache: +-1 / 0
    weight = torch.randint(-1, 2, (c, c, 3, 3, 3), generator=g).to(dtype).to(DEVICE)
    bias = torch.randint(-4, 5, (c,), generator=g).to(dtype).to(DEVICE)
    gamma = torch.ones(c, 1, 1, 1, dtype=dtype, device=DEVICE)
    gamma2 = (1 + 0.1 * torch.randn(c, 1, 1, 1, generator=g)).to(dtype).to(DEVICE)
    cache2 = None if mode == "chunk0" else rnd(1, c, 2, h, w)
    weight2, bias2 = rnd(c, c, 3, 3, 3, scale=(27 * c) ** -0.5), rnd(c)
    res = rnd(1, c, frames, h, w) if residual else None
    rb = rnd(c) if residual and residual_bias else None
    pad = [1, 1, 1, 1, 2, 0] if mode == "chunk0" else [1, 1, 1, 1, 0, 0]
    return (x, gamma, 1.0, 0.0, 1e-12, True, None, cache, pad, mode, weight, bias,
            gamma2, c ** 0.5, 0.0, 1e-12, True, "silu", cache2, pad, mode, weight2, bias2, res, rb)


def _two_ops(args):
    """The pair op's definition: the two `rms_norm_causal_conv3d_fast` ops it fuses."""
    (x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias,
     gamma2, scale2, norm_bias2, eps2, upcast2, act2, cache2, pad2, mode2, weight2, bias2, res, rb) = args
    fast = torch.ops.rewrite.rms_norm_causal_conv3d_fast
    y, next_cache = fast(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, None, None, None,
                         None, True)
    out, next_cache2 = fast(y, gamma2, scale2, norm_bias2, eps2, upcast2, act2, cache2, pad2, mode2, weight2, bias2,
                            res, bias, rb, False)
    return out, next_cache, next_cache2


def _pair_fused(monkeypatch):
    """Record each launch of the fused norm epilogue (its residual argument: None without one)."""
    calls, original = [], triton_conv3d.conv3d_channels_last_norm_padded

    def spy(*args, **kwargs):
        calls.append(kwargs.get("residual"))
        return original(*args, **kwargs)

    monkeypatch.setattr(triton_conv3d, "conv3d_channels_last_norm_padded", spy)
    return calls


def _check_pair(args, pair):
    """The pair op's outputs on `_pair_inputs`, part by part:

    * the first next cache is the first fused op's, bit for bit (the same norm kernel);
    * the second norm's values (the new frames of the second next cache) are within one output ulp of the
      float64 norm + SiLU of the exact first conv output. The op computes them in fp32 and rounds once: the
      fp32 steps (squares summed, approximate sqrt, reciprocal and sigmoid) err by a few 2^-22 relative, at
      most ~2e-5 after SiLU's amplification (|x silu'(x) / silu(x)| <= 1 + |x|, |x| < 12 here), far below
      the half ulp (2^-9 relative) the rounding adds; the cache frames before them are the pad kernel's;
    * the output is `conv3d_channels_last` (same kernel, same tile) of the padded input rebuilt from those
      values with the reference input assembly, bit for bit: the fused stores put every value where the
      second conv reads it."""
    from rewrite.models.wan.reference import causal_conv_input_reference

    (x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias,
     gamma2, scale2, norm_bias2, eps2, upcast2, act2, cache2, pad2, mode2, weight2, bias2, res, rb) = args
    out, next_cache, next_cache2 = pair
    expected_out, expected_cache, expected_cache2 = _two_ops(args)
    assert torch.equal(next_cache, expected_cache) and next_cache.stride() == expected_cache.stride()
    assert next_cache2.stride() == expected_cache2.stride() and out.stride() == expected_out.stride()
    raw, _ = torch.ops.rewrite.rms_norm_causal_conv3d_fast(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad,
                                                            mode, weight, None, None, None, None, True)
    y = raw.double() + bias.double().view(-1, 1, 1, 1)  # exact (the inputs' construction)
    v = y / torch.linalg.vector_norm(y, dim=1, keepdim=True).clamp_min(eps2) * scale2 * gamma2.double() + norm_bias2
    v = torch.nn.functional.silu(v)
    frames = x.shape[2]
    new = next_cache2[:, :, 2 - frames:]
    assert torch.equal(next_cache2[:, :, :2 - frames], expected_cache2[:, :, :2 - frames])
    error = (new.double() - v).abs()
    assert bool((error <= ulp(v, new.dtype)).all()), error.max().item()
    padded2 = causal_conv_input_reference(new, cache2, pad2, mode2)[0].contiguous(memory_format=CL)
    rebuilt = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)
    triton_conv3d.conv3d_channels_last(padded2, weight2.contiguous(memory_format=CL), bias2, res, rebuilt, rb)
    assert torch.equal(out, rebuilt), (out.float() - rebuilt.float()).abs().max().item()


@needs_kernels
@pytest.mark.parametrize("mode,residual,residual_bias", quick.product(
    {mode: (mode,) for mode in ("steady", "steady_t1", "chunk0")},
    {f"residual_{r}-bias_{b}": (r, b) for r, b in ((True, True), (True, False), (False, False))}))
def test_pair_op_on_exact_first_conv_values(kernel_allowed_on_cpu, monkeypatch, mode, residual, residual_bias):
    kernel_gates_open(monkeypatch)
    args = _pair_inputs(mode, residual, residual_bias)
    calls = _pair_fused(monkeypatch)
    pair = torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast(*args)
    assert calls, "the fused epilogue did not run"
    _check_pair(args, pair)


@needs_kernels
@pytest.mark.parametrize("tile,mode", [  # quick: one (flat programs: `test_flat_programs_in_every_layout`)
    pytest.param(ConvTile(16, 32, 16, 4, 2, 16, 2), "chunk0", id="two_row_programs-chunk0"),
    pytest.param(ConvTile(16, 32, 16, 4, 2, 16, 2), "steady", id="two_row_programs-steady", marks=quick.slow),
    pytest.param(ConvTile(16, 32, 16, 4, 2, 16, flat=True), "chunk0", id="flat_programs-chunk0", marks=quick.slow),
    pytest.param(ConvTile(16, 32, 16, 4, 2, 16, flat=True), "steady", id="flat_programs-steady", marks=quick.slow)])
def test_pair_op_with_split_channels(kernel_allowed_on_cpu, monkeypatch, mode, tile):
    """The norm epilogue over a 32 + 16 channel split (three 16-channel stores per row, as 128 + 64 for 192
    channels): in programs of two rows (the second skipped past the odd row count), and in flat programs (16
    positions of rows laid out 20 apart: most store into two rows of the next padded input and cache, zeros at
    the pads between them; the last runs into the bottom pad; output and residual by pointers): `_check_pair`.
    A caller that asks for no flat tile gets the row form of `tile`."""
    kernel_gates_open(monkeypatch)
    monkeypatch.setattr(triton_conv3d, "_FASTER_THAN_CUDNN", {(48, 48, 27): math.inf})
    monkeypatch.setattr(triton_conv3d, "_NORM_EPILOGUE_FASTER", frozenset({(48, 48)}))
    monkeypatch.setattr(triton_conv3d, "launch_config",
                        lambda c, o, w=None, k=3, flat=True: tile._replace(flat=tile.flat and flat))
    args = _pair_inputs(mode, True, True, c=48, h=5, w=18)
    calls = _pair_fused(monkeypatch)
    pair = torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast(*args)
    assert calls, "the fused epilogue did not run"
    _check_pair(args, pair)


@needs_kernels
def test_pair_op_runs_the_two_ops_where_the_epilogue_cannot_hold_every_channel(kernel_allowed_on_cpu, monkeypatch):
    kernel_gates_open(monkeypatch)
    monkeypatch.setattr(triton_conv3d, "launch_config", lambda c, o, w=None, *_, **__: ConvTile(32, 8, 16, 4, 2))  # 16 = 2 x 8
    args = _pair_inputs("steady", True, False)
    calls = _pair_fused(monkeypatch)
    pair = torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast(*args)
    assert not calls
    assert all(torch.equal(a, e) for a, e in zip(pair, _two_ops(args)))
    assert "span several programs" in wan_fast.pair_reason(16, 16, (1, 16, 4, 5, 21), (16, 16, 3, 3, 3),
                                                           torch.bfloat16, "silu")


def test_pair_op_off_the_kernel_path_is_the_two_ops():
    args = _pair_inputs("steady", True, True, dtype=torch.float32)  # CPU, auto backend: the lossless ops
    pair = torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast(*args)
    assert all(torch.equal(a, e) for a, e in zip(pair, _two_ops(args)))


def test_pair_reason_names_the_activation_and_the_measurement():
    assert "activation" in wan_fast.pair_reason(96, 96, (1, 96, 6, 10, 10), (96, 96, 3, 3, 3), torch.bfloat16, "gelu")
    assert wan_fast.pair_reason(96, 96, (1, 96, 6, 10, 10), (96, 96, 3, 3, 3), torch.bfloat16, "silu") is None
    assert "measured slower" in wan_fast.pair_reason(32, 96, (1, 96, 6, 10, 10), (96, 96, 3, 3, 3), torch.bfloat16,
                                                     "silu")


def test_pair_pattern_fuses_every_served_conv_pair_of_a_block(monkeypatch):
    """Structure on a CPU capture standing in for a CUDA one (the bias-deferral guards' device test patched,
    the kernel gates open for the tiny model's 16-channel convs): every block conv pair whose convs the fast
    op serves becomes one pair op, and no raw channels-last conv output is left feeding a fast conv."""
    from rewrite.pipeline import rewrite_graph

    monkeypatch.setattr(dispatch, "conv_bias_is_separate", lambda device: True)
    monkeypatch.setattr(dispatch, "INTERPRETING", True)
    kernel_gates_open(monkeypatch)
    fast, pair = torch.ops.rewrite.rms_norm_causal_conv3d_fast.default, torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast.default
    fused = 0
    for graph in tiny_wan("wan2.1", torch.bfloat16)[1]:
        rewrite_graph(graph, "channels_last")
        nodes = list(graph.graph_module.graph.nodes)
        fused += sum(n.target is pair for n in nodes)
        for node in nodes:
            if node.target is fast and node.args[-1] is True:  # a raw channels-last conv output
                readers = {u.target for item in node.users for u in item.users}
                assert fast not in readers, (graph.name, node.name)
    assert fused > 0


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["steady", "chunk0"])
@pytest.mark.parametrize("c,h,w", [(96, 4, 300), (96, 5, 832), (192, 4, 640)])
def test_gpu_pair_op_on_the_wan_shape_class(monkeypatch, mode, c, h, w):
    """The chosen tiles of the pair's shape classes: 96 channels as 64 + 32 (256-pixel programs, or two rows of
    64 at 832 wide, an odd row count), 192 as 128 + 64: `_check_pair`."""
    args = _pair_inputs(mode, True, False, c=c, h=h, w=w)
    calls = _pair_fused(monkeypatch)
    pair = torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast(*args)
    assert calls, "the fused epilogue did not run"
    _check_pair(args, pair)
