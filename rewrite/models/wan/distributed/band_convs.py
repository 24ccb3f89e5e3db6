"""The convolutions of a halo-first band graph: a band form and a gathered form of each, and the check that
chooses between them.

cuDNN picks its kernel, and with it the summation order, from the problem's shape. On the H200 a band's
rows of Wan 2.1's 192- and 384-channel convs at 480p, and of Wan 2.2's 512- and 1024-channel convs at 720p,
differ from the same rows of the whole conv (docs/distributed.md). So each spatial conv of the halo-first
decoder (`rewrite.models.wan.distributed.band_graphs`) has two forms:

* **band form**: the conv of this rank's band: a 3x3x3 causal conv on its halo row band with its rows
  unpadded (the halo rows are the row pad), a pointwise-in-space conv (1x1x1 shortcut, 3x1x1 `time_conv`) on
  the band as it is, a resampler's 2x upsample and 3x3 conv2d on the upsampled halo band, cropped;
* **gathered form**: this rank's rows all-gathered (`rewrite::band_gather_rows`), the single-process conv
  (or upsample and conv) on the whole tensor, this rank's rows kept (`rewrite::band_own_rows`): the same
  call as in the single-process decode, so exact by construction, at the cost of the whole conv on every
  rank.

`ConvForms` says which calls take the gathered form; a call is named by `ConvCall` (the module, and the
shapes and dim orders of its inputs). A graph pair is exported with every conv in band form first, which
records the calls; each call is then checked (`check_call`) outside any capture: seeded random input of
the whole tensor's shape and layout, the module's own weights; the band form's output must be
`torch.equal` to the same rows of the whole conv's. Calls that fail are exported again in gathered form;
the ranks then take the union of their gathered calls (a gather is a collective: every rank must make it).
Like every self-check of the project a check is evidence per shape on one input, not a proof for all
values: the graph pair's own check against the eager band mode follows.

Exactness class of both forms: `torch.equal` to the single-process conv where the check passed (band form)
or always (gathered form). Preconditions: the halo-first decoder's geometry (`BandContext`); the band form
of a causal conv assumes `_padding` rows of 1 (3x3x3) or 0 (pointwise).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from rewrite.models.wan.distributed.band_ops import halo_rows
from rewrite.models.wan.distributed.bands import diffusers_wan, dim_order, seeded_random, zero_padded_rows

ops = torch.ops.rewrite

CAUSAL_HALO = "causal conv on a halo band"
CAUSAL_POINTWISE = "pointwise-in-space causal conv"
RESAMPLE_HALO = "upsample and conv2d on a halo band"


@dataclasses.dataclass(frozen=True)
class ConvCall:
    """One conv call of a band step graph: the module's name, its form family (`CAUSAL_HALO`, ...), and
    (shape, dim order) of its input and of its cache frames (None without)."""

    module: str
    kind: str
    x: tuple
    cache: tuple | None = None

    def describe(self) -> str:
        return f"{self.module} ({self.kind}, input {self.x[0]})"


def _spec(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (tuple(int(s) for s in t.shape), dim_order(t))


class ConvForms:
    """Which conv calls of one halo-first decoder take the gathered form (`gathered`), and the calls seen
    while it was traced (`calls`, in first-seen order: the same on every rank), and each causal conv's
    single-process `_padding` by module name (`paddings`, set by the decoder's conversion)."""

    def __init__(self, context_id: int, gathered=()) -> None:
        self.context_id = context_id
        self.gathered: set[ConvCall] = set(gathered)
        self.calls: list[ConvCall] = []
        self.paddings: dict[str, tuple] = {}

    def gathers(self, call: ConvCall) -> bool:
        if call not in self.calls:
            self.calls.append(call)
        return call in self.gathered


# ---- the forms (installed on the halo-first decoder copy as instance forwards) -------------------------
def _with_cache(x: torch.Tensor, cache_x, padding) -> tuple[torch.Tensor, list[int]]:
    """(the cache frames before x, the `_padding` left to apply), as `WanCausalConv3d.forward` makes them."""
    padding = list(padding)
    if cache_x is not None and padding[4] > 0:
        x = torch.cat([cache_x.to(x.device), x], dim=2)
        padding[4] -= cache_x.shape[2]
    return x, padding


def _causal(m: nn.Module, x: torch.Tensor, cache_x, padding) -> torch.Tensor:
    """`WanCausalConv3d.forward` with the given `_padding`."""
    x, padding = _with_cache(x, cache_x, padding)
    return nn.Conv3d.forward(m, F.pad(x, padding))


def causal_conv_forward(m: nn.Module, forms: ConvForms, name: str, halo: int, whole_padding, x, cache_x=None):
    """A causal conv of the halo-first decoder: band form (diffusers' forward with the module's band
    `_padding`) or gathered form (own rows of cache and input gathered, the whole conv, own rows kept).
    `halo`: the rows each side that the input carries (1 for a 3x3x3 conv, 0 for a pointwise one)."""
    call = ConvCall(name, CAUSAL_HALO if halo else CAUSAL_POINTWISE, _spec(x),
                    _spec(cache_x) if cache_x is not None and whole_padding[4] > 0 else None)
    if not forms.gathers(call):
        return diffusers_wan().WanCausalConv3d.forward(m, x, cache_x)
    x, padding = _with_cache(x, cache_x, whole_padding)
    if halo:
        x = x[..., halo:-halo, :]
    whole = ops.band_gather_rows(x, forms.context_id)
    return ops.band_own_rows(nn.Conv3d.forward(m, F.pad(whole, padding)), forms.context_id)


def cropped_conv2d(m: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The resampler's 3x3 conv of the upsampled halo band: columns padded, rows not, one row cut each side."""
    y = F.conv2d(x, m.weight, m.bias, m.stride, (0, m.padding[1]), m.dilation, m.groups)
    return y[:, :, 1:-1, :]


def resample_forward(seq: nn.Sequential, forms: ConvForms, name: str, x: torch.Tensor) -> torch.Tensor:
    """A resampler's `Sequential(WanUpsample, Conv2d)`: band form (the halo band upsampled, convolved with
    rows unpadded, cropped) or gathered form (upsample and conv on the whole tensor, own rows kept)."""
    up, conv = seq[0], seq[1]
    upsample = diffusers_wan().WanUpsample.forward
    if not forms.gathers(ConvCall(name, RESAMPLE_HALO, _spec(x))):
        return cropped_conv2d(conv, upsample(up, halo_rows(x, forms.context_id)))
    whole = ops.band_gather_rows(x, forms.context_id)
    return ops.band_own_rows(nn.Conv2d.forward(conv, upsample(up, whole)), forms.context_id)


# ---- the check ----------------------------------------------------------------------------------------
def check_call(call: ConvCall, module: nn.Module, whole_padding, rows, rank: int, like: torch.Tensor):
    """(ok, reason): whether the band form of `call` gives the same bits as the same rows of its whole
    conv, on seeded random input of the whole tensor's shape (module docstring). `module`: the decoder
    copy's module (band `_padding` for a causal conv); `whole_padding`: its single-process `_padding`
    (causal convs); `rows`, `rank`: the latent bands and this rank; `like`: a tensor of the dtype and
    device."""
    a, b = rows[rank]
    height = rows[-1][1]
    halo = {CAUSAL_HALO: 1, CAUSAL_POINTWISE: 0, RESAMPLE_HALO: 0}[call.kind]
    band_rows = call.x[0][-2] - 2 * halo
    s = band_rows // (b - a)
    if s < 1 or s * (b - a) != band_rows:
        return False, f"{call.describe()}: {band_rows} rows is no multiple of the latent band {b - a}"

    def whole_of(spec, seed):
        shape = list(spec[0])
        shape[-2] = s * height
        return seeded_random(shape, like, seed + 7919 * len(shape) + shape[-2], order=spec[1])

    x = whole_of(call.x, 1)
    cache = whole_of(call.cache, 2) if call.cache is not None else None
    lo, hi = s * a, s * b
    with torch.no_grad():
        if call.kind == RESAMPLE_HALO:
            up, conv = module[0], module[1]
            upsample = diffusers_wan().WanUpsample.forward
            expected = nn.Conv2d.forward(conv, upsample(up, x))[..., 2 * lo:2 * hi, :]
            band = cropped_conv2d(conv, upsample(up, zero_padded_rows(x, lo - 1, hi + 1)))
        else:
            expected = _causal(module, x, cache, whole_padding)[..., lo:hi, :]

            def cut(t):
                return None if t is None else zero_padded_rows(t, lo - halo, hi + halo)
            band = _causal(module, cut(x), cut(cache), module._padding)
    if band.shape != expected.shape:
        return False, f"{call.describe()}: the band form gives {tuple(band.shape)}, the whole conv's rows " \
                      f"{tuple(expected.shape)}"
    if not torch.equal(band, expected):
        return False, (f"{call.describe()}: the band form of rows {lo}:{hi} differs from the same rows of the "
                       f"whole conv ({like.dtype}, {like.device})")
    return True, ""
