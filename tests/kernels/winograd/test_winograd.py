"""The Winograd F(2x2, 3x3) conv kernel (`rewrite.kernels.winograd`): against the conv in float64 on small odd shapes
(under the interpreter on CPU, on CUDA where there is one), its arguments and refusals, the weight transform.

Tolerance, derived rather than fitted. Every output is a sum of terms coef * x * g (coef the product of the
transforms' entries along its path). Along any one term's path the kernel performs at most n = K + 23 fp32
operations (K = kt * C GEMM terms: K - 1 additions and 1 product; the input transform 3 additions; the weight
transform 8 additions and 2 products; the output transform 8 additions; bias and residual 2 additions), so by the
standard bound for sums of products its fp32 result is within gamma_n * S of the exact value, gamma_n = n u /
(1 - n u), u = 2**-24, where S is the same computation on magnitudes: |A^T| [(|G| |g| |G^T|) * (|B^T| |d| |B|)]
|A| summed over channels and taps, plus |bias| + |residual| (`_magnitudes`). In bf16/fp16 the transformed input
and weight are each rounded once (relative error u16 = 2**-8 for bf16, 2**-11 for fp16: 2 u16 + u16**2 more on
every term) and the output once more (u16 * |y|).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from rewrite.kernels.winograd import materialized, winograd
from rewrite.kernels.winograd.transforms import (FILTER_TRANSFORM, INPUT_TRANSFORM, OUTPUT_TRANSFORM, POINTS,
                                                 transformed_weight)
from rewrite.kernels.winograd.winograd import WinogradTile, winograd_conv3d, winograd_conv3d_channels_last
from rewrite.ops.dispatch import INTERPRETING
from tests import quick

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
needs_kernels = pytest.mark.skipif(not (CUDA or INTERPRETING), reason="needs CUDA or TRITON_INTERPRET=1")
CL = torch.channels_last_3d
SMALL = WinogradTile(16, 16, 16, 4, 1)  # small blocks: partial blocks of tiles, channels and outputs in every case
FORMS = {"fused": SMALL, "materialized": SMALL._replace(materialized=True),
         "materialized-by-frame": SMALL._replace(materialized=True, transform_frames=1),
         "materialized-one-loop": SMALL._replace(materialized=True, one_loop=True),
         "materialized-split": SMALL._replace(materialized=True, split_output=True)}
UNIT_ROUNDING = {torch.float32: 0.0, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def _padded(batch, channels, frames, height, width, cache, generator, taps=3):
    """The causal conv's padded input as the ops build it: kt - 1 cached frames (or zeros) before the new frames,
    one zero pixel around each plane."""
    x = torch.randn(batch, channels, frames, height, width, generator=generator)
    before = torch.randn(batch, channels, taps - 1, height, width, generator=generator) if cache else x.new_zeros(
        batch, channels, taps - 1, height, width)
    return F.pad(torch.cat([before, x], 2), (1, 1, 1, 1))


def _magnitudes(padded, weight, bias, residual, block=2,
                transforms=(INPUT_TRANSFORM, FILTER_TRANSFORM, OUTPUT_TRANSFORM)):
    """S of the module docstring, in float64: the Winograd computation on magnitudes, for `block` x `block` output
    blocks by `transforms` (B^T, G, A^T)."""
    b, c, tp, hp, wp = padded.shape
    o, _, kt = weight.shape[:3]
    t, h, w = tp - kt + 1, hp - 2, wp - 2
    rows, cols = -(-h // block), -(-w // block)
    patch = block + 2
    d = F.pad(padded.double().abs(), (0, block * cols + 2 - wp, 0, block * rows + 2 - hp))
    patches = d.unfold(3, patch, block).unfold(4, patch, block)  # [b, c, tp, rows, cols, patch, patch]
    bt, g, at = (torch.tensor(m, dtype=torch.float64, device=padded.device).abs() for m in transforms)
    v = torch.einsum("ru,bctyxuv,sv->bctyxrs", bt, patches, bt)
    u = torch.einsum("rh,octhw,sw->octrs", g, weight.double().abs(), g)
    m = sum(torch.einsum("ocrs,bctyxrs->botyxrs", u[:, :, tap], v[:, :, tap: tap + t]) for tap in range(kt))
    y = torch.einsum("ir,botyxrs,js->botyixj", at, m, at).reshape(b, o, t, block * rows, block * cols)[..., :h, :w]
    if bias is not None:
        y = y + bias.double().abs()[:, None, None, None]
    if residual is not None:
        y = y + residual.double().abs()
    return y


def _bound(padded, weight, bias, residual, exact, dtype, more_additions=0):
    """The module docstring's bound; `more_additions`: fp32 operations a caller adds on every path."""
    n = weight.shape[1] * weight.shape[2] + 23 + more_additions
    gamma = n * 2.0 ** -24 / (1 - n * 2.0 ** -24)
    u16 = UNIT_ROUNDING[dtype]
    return (gamma + 2 * u16 + u16 * u16) * _magnitudes(padded, weight, bias, residual) + u16 * exact.abs()


CASES = {  # batch, in channels, out channels, output frames, height, width, cache, bias, residual
    "one-frame-odd-plane": (1, 16, 16, 1, 5, 7, False, True, False),
    "three-frames-cache": (2, 24, 24, 3, 6, 9, True, True, True),   # channels and outputs past the blocks, batch 2
    "channels-not-a-multiple-of-8": (1, 20, 12, 1, 4, 5, False, True, False),  # the fused form only (TMA: no)
    "batch-2-one-column": (2, 16, 8, 1, 3, 1, True, False, True),    # a plane one pixel wide
    "wide-k": (1, 48, 40, 2, 4, 5, False, True, True),               # K = 3 channel blocks per tap
}


@needs_kernels
@pytest.mark.parametrize("form,dtype,case", quick.product(
    {f"{form}-{dtype}": (form, dtype) for form in FORMS for dtype in (torch.float32, torch.bfloat16, torch.float16)},
    {name: (name,) for name in CASES}))
def test_winograd_conv3d_is_within_its_derived_bound_of_the_exact_conv(form, dtype, case):
    if dtype == torch.float32 and not INTERPRETING:
        pytest.skip("fp32 is served only under the interpreter")
    batch, cin, cout, frames, height, width, cache, has_bias, has_residual = CASES[case]
    if form.startswith("materialized") and materialized.unsupported_reason(cin, cout):
        pytest.skip(materialized.unsupported_reason(cin, cout))  # its refusal is tested below
    generator = torch.Generator().manual_seed(0)
    padded = _padded(batch, cin, frames, height, width, cache, generator).to(dtype)
    weight = (torch.randn(cout, cin, 3, 3, 3, generator=generator) / (27 * cin) ** 0.5).to(dtype)
    bias = torch.randn(cout, generator=generator).to(dtype) if has_bias else None
    residual = torch.randn(batch, cout, frames, height, width, generator=generator).to(dtype) if has_residual else None
    exact = F.conv3d(padded.double(), weight.double(), None if bias is None else bias.double())
    if residual is not None:
        exact = exact + residual.double()
    actual = winograd_conv3d(padded.to(DEVICE), weight.to(DEVICE), None if bias is None else bias.to(DEVICE),
                             None if residual is None else residual.to(DEVICE), FORMS[form]).cpu()
    bound = _bound(padded, weight, bias, residual, exact, dtype)
    error = (actual.double() - exact).abs()
    assert actual.dtype == dtype and actual.is_contiguous(memory_format=CL)
    assert torch.all(error <= bound), f"worst error / bound {(error / bound).max().item():.3g}"


@needs_kernels
@pytest.mark.parametrize("form", FORMS)
def test_the_output_may_have_any_strides_and_the_default_blocks_serve(form):
    generator = torch.Generator().manual_seed(1)
    padded = _padded(1, 32, 2, 4, 6, True, generator).to(DEVICE).contiguous(memory_format=CL)
    weight = torch.randn(16, 32, 3, 3, 3, generator=generator).to(DEVICE)
    tile = FORMS[form]._replace(block_m=32, block_n=64, block_k=32)  # the default blocks, in each form
    channels_last = winograd_conv3d(padded, weight, tile=tile)
    ncdhw = torch.empty(channels_last.shape, device=DEVICE)
    winograd_conv3d_channels_last(padded, transformed_weight(weight), None, None, ncdhw, tile)
    assert ncdhw.is_contiguous() and torch.equal(ncdhw, channels_last)  # the same sums, stored by other strides


def test_the_weight_transform_gives_the_product_the_direct_filter_gives():
    """One 4x4 input patch: A^T [(G g G^T) * (B^T d B)] A equals the valid 3x3 conv of d (2x2), in float64."""
    generator = torch.Generator().manual_seed(2)
    d = torch.randn(4, 4, generator=generator, dtype=torch.float64)
    g = torch.randn(1, 1, 1, 3, 3, generator=generator, dtype=torch.float64)
    u = transformed_weight(g)  # [16, 1, 1]
    bt, at = (torch.tensor(m, dtype=torch.float64) for m in (INPUT_TRANSFORM, OUTPUT_TRANSFORM))
    y = at @ (u.view(4, 4) * (bt @ d @ bt.T)) @ at.T
    direct = F.conv2d(d.view(1, 1, 4, 4), g.view(1, 1, 3, 3)).view(2, 2)
    assert u.shape == (POINTS, 1, 1)
    assert torch.allclose(y, direct, rtol=0, atol=1e-12)  # float64 rounding of 16 short sums: far below 1e-12


@pytest.mark.parametrize("in_shape,weight_shape,dtype,expected", [
    ((1, 16, 3, 6, 6), (16, 16, 3, 1, 1), torch.bfloat16, "serves 3x3 planes"),
    ((1, 16, 3, 6, 6), (16, 8, 3, 3, 3), torch.bfloat16, "expected [B, C, T, H, W]"),
    ((1, 16, 3, 2, 6), (16, 16, 3, 3, 3), torch.bfloat16, "smaller than the kernel"),
    ((1, 16, 3, 6, 6), (16, 16, 3, 3, 3), torch.float64, "dtype torch.float64"),
], ids=("1x1 kernel", "channel mismatch", "plane too small", "float64"))
def test_unsupported_cases_are_refused_with_the_reason(in_shape, weight_shape, dtype, expected):
    reason = winograd.unsupported_reason(in_shape, weight_shape, dtype)
    assert reason is not None and expected in reason, reason


def test_bad_arguments_raise_errors_naming_what_was_expected():
    padded = torch.zeros(1, 16, 3, 6, 6).contiguous(memory_format=CL)
    weight = transformed_weight(torch.zeros(8, 16, 3, 3, 3))
    out = torch.empty(1, 8, 1, 4, 4)
    with pytest.raises(ValueError, match="channels-last"):
        winograd_conv3d_channels_last(padded.contiguous(), weight, None, None, out)
    with pytest.raises(ValueError, match=r"contiguous \[16, kt \* 16, O\]"):
        winograd_conv3d_channels_last(padded, weight[:, :40], None, None, out)
    with pytest.raises(ValueError, match=r"out must be \(1, 8, 1, 4, 4\)"):
        winograd_conv3d_channels_last(padded, weight, None, None, torch.empty(1, 8, 1, 4, 5))
    with pytest.raises(ValueError, match=r"bias must be \[8\]"):
        winograd_conv3d_channels_last(padded, weight, torch.zeros(16), None, out)
    with pytest.raises(ValueError, match="expected a"):
        transformed_weight(torch.zeros(8, 16, 3, 5, 5))
    odd = torch.zeros(1, 20, 3, 6, 6).contiguous(memory_format=CL)
    with pytest.raises(ValueError, match="TMA needs multiples of 8"):
        winograd_conv3d(odd, torch.zeros(8, 20, 3, 3, 3), tile=WinogradTile(materialized=True))


def test_no_conv_is_routed_to_winograd_off_a_measured_card():
    """The choice is read from a per-card table the GPU sweep fills: a CPU tensor never takes it."""
    assert winograd.chosen(96, 96, 160, torch.bfloat16, torch.device("cpu")) is None


def test_a_sweep_candidate_is_not_routed_until_a_decode_measured_it(monkeypatch):
    """`UNMEASURED_CANDIDATES` holds sweep winners no decode has measured: none of them is also in the routed table,
    and `chosen` answers None for each on its card."""
    from rewrite.kernels import cards
    from rewrite.kernels.winograd import common

    for card, candidates in common.UNMEASURED_CANDIDATES.items():
        monkeypatch.setattr(cards, "name", lambda device, card=card: card)
        routed = common._MEASURED_FASTER.get(card, {})
        for in_channels, out_channels, width, dtype in candidates:
            assert (in_channels, out_channels, width, dtype) not in routed
            assert winograd.chosen(in_channels, out_channels, width, dtype, torch.device("cuda")) is None


def test_a_symbolic_width_is_looked_up_by_channels_and_dtype(monkeypatch):
    """A pattern's guard sees the graph's symbolic width (a SymInt, unhashable): the card's entries are read by
    channels and dtype, and the op decides on its tensors' width; an empty table answers None without hashing."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from rewrite.kernels import cards
    from rewrite.kernels.winograd import common

    env = ShapeEnv()
    width = env.create_symintnode(env.create_symbol(160, ConstantSource("width")), hint=160)
    card = "NVIDIA H100 80GB HBM3"
    monkeypatch.setattr(cards, "name", lambda device: card)
    cuda = torch.device("cuda")
    shipped = common._MEASURED_FASTER
    monkeypatch.setattr(common, "_MEASURED_FASTER", {})
    assert winograd.chosen(1024, 1024, width, torch.bfloat16, cuda) is None
    monkeypatch.setattr(common, "_MEASURED_FASTER", shipped)
    assert winograd.chosen(1024, 1024, width, torch.bfloat16, cuda) == common._MEASURED_FASTER[card][
        (1024, 1024, 160, torch.bfloat16)]
    assert winograd.chosen(96, 96, width, torch.bfloat16, cuda) is None  # no entry for these channels
    assert winograd.chosen(1024, 1024, width, torch.float16, cuda) is None
