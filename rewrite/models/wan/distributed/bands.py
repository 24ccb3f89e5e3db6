"""Band-local forms of the Wan decoder's modules, and the per-shape checks that admit them.

A band is a range of latent rows, [a, b), on one rank (batch, frames, channels and columns whole); at a
resolution s times the latent's (after the spatial upsamplers) the band is rows [s a, s b). What each
module of `WanDecoder3d` does on a band (`band_decoder` installs these forwards on a `tracing_copy` of the
decoder: the live module is never touched):

* `WanCausalConv3d` / the resamplers' `nn.Conv2d`: the cache frames are concatenated as diffusers does
  (the cache holds this band's rows only), then one halo row from each neighbour (`Comm.exchange_halo`,
  cache frames included), the zero pad only at the global top/bottom edges (and on the columns), the conv
  unpadded in rows. 1x1 and (3,1,1) convs take no halo.
* `WanRMS_norm` (over channels), `nn.SiLU`: per pixel, on the band as it is.
* `WanAttentionBlock` (the middle block): its input all-gathered, the block run on the whole tensor, the
  own rows kept.
* `WanUpsample` (nearest-exact x2), `DupUp3D`, residual adds, the time reshapes and `unpatchify`: data
  movement or exact per-element arithmetic, the band's rows map to rows [2a, 2b): as they are.

Exactness. A conv or norm library may pick its kernel (and so its summation order) from the shape, and on
the CPU an elementwise op's result may depend on an element's position (ATen's vectorized body against its
scalar tail: measured here for SiLU in fp32 and bf16). So every band-local conv, norm and SiLU is admitted
only after a check, once per process for its shapes, device and settings, outside any capture:

* convs and norms (`spatial_check`): seeded random input of the whole tensor's shape and layout, the
  module's own weights; the band form (halo rows cut from the same input) must be `torch.equal` to the
  same rows of the module's own forward on the whole tensor;
* SiLU (`position_independent`): the op over every bf16/fp16 bit pattern (fp32: 2**20 spread patterns and
  the special values), contiguous (vectorized) against strided (scalar), must agree bit for bit.

All ranks agree on each verdict (a MIN all-reduce on the first use of a shape). An op whose check fails on
any rank runs on the gathered whole tensor on every rank and keeps the own rows (the single-process op on
the single-process tensor: exact by construction), logged once with the reason. Like the project's conv
self-checks (docs/design.md section 6.4) the checks are evidence per shape, not a proof for all values.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

from rewrite.capture.export import tracing_copy

logger = logging.getLogger("rewrite.models.wan.distributed")

#: latent rows every band needs: with one row the band's size-1 row dim makes ATen choose other memory
#: layouts (cat, pad) than for the whole tensor (measured: a 1-row band's conv input came out frame-major
#: where the 2-row band's was contiguous)
MIN_BAND_ROWS = 2

#: process-wide local verdicts: key -> (ok, reason)
_LOCAL: dict[tuple, tuple[bool, str]] = {}
#: verdicts all ranks agreed on, per group: (group name, ranks) -> {global key: ok}
_AGREED: dict[tuple, dict[tuple, bool]] = {}


def forget_verdicts(comm) -> None:
    """Drop the verdicts this group agreed on (after a failed call every rank raises and calls this, so a
    group made again under the same name starts from the same, empty, state on every rank)."""
    _AGREED.pop((comm.name, comm._global), None)


def split_rows(height: int, world: int) -> list[tuple[int, int]]:
    """Latent row bands [start, stop) per rank: as even as possible, the first `height % world` one row
    taller. Every band has at least one row when height >= world."""
    base, extra = divmod(height, world)
    rows, start = [], 0
    for r in range(world):
        stop = start + base + (1 if r < extra else 0)
        rows.append((start, stop))
        start = stop
    return rows


def diffusers_wan():
    """diffusers' Wan VAE module (imported on first use: importing diffusers takes seconds)."""
    from diffusers.models.autoencoders import autoencoder_kl_wan as wan

    return wan


def dim_order(t: torch.Tensor) -> tuple[int, ...]:
    """Dims from outermost to innermost by stride (stable: size-1 dims keep their place)."""
    return tuple(sorted(range(t.dim()), key=lambda d: -t.stride(d)))


def layout_key(t: torch.Tensor) -> tuple:
    """The dim order and contiguity of a band: the same on every rank where every band has 2 rows or more
    (a band of one row makes its dim order ambiguous, and ATen's layout choices for it differ from the whole
    tensor's: `MIN_BAND_ROWS`)."""
    return dim_order(t), t.is_contiguous()


def empty_like_layout(shape, like: torch.Tensor) -> torch.Tensor:
    """An empty tensor of `shape` whose dims are laid out in `like`'s order (dense)."""
    order = dim_order(like)
    base = torch.empty([shape[d] for d in order], dtype=like.dtype, device=like.device)
    inverse = [order.index(d) for d in range(len(order))]
    return base.permute(inverse)


def compact_like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A dense copy of `t` laid out as `like` is (a row slice made dense again, layout kept)."""
    out = empty_like_layout(t.shape, like)
    out.copy_(t)
    return out


def backend_settings(device: torch.device) -> tuple:
    if device.type == "cuda":
        b = torch.backends.cudnn
        return ("cuda", torch.cuda.get_device_name(device), b.enabled, b.benchmark, b.deterministic,
                b.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    return (device.type, torch.get_num_threads(), torch.backends.mkldnn.enabled)


def seeded_random(shape, like: torch.Tensor, seed: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Seeded normal values of `shape` in `like`'s dtype and device, dense with its dims laid out in `order`
    (default: `like`'s order)."""
    order = dim_order(like) if order is None else order
    generator = torch.Generator(device=like.device).manual_seed(seed)
    values = torch.randn([shape[d] for d in order], generator=generator, device=like.device,
                         dtype=torch.float32 if like.dtype in (torch.bfloat16, torch.float16) else like.dtype)
    return values.to(like.dtype).permute([order.index(d) for d in range(len(order))])


def zero_padded_rows(whole: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Rows [lo, hi) of `whole` (rows in dim -2; zeros beyond its edges), dense in its layout."""
    shape = list(whole.shape)
    shape[-2] = hi - lo
    out = compact_like(torch.zeros(shape, dtype=whole.dtype, device=whole.device), whole)
    a, b = max(lo, 0), min(hi, whole.shape[-2])
    out[..., a - lo:b - lo, :] = whole[..., a:b, :]
    return out


def position_independent(fn, dtype: torch.dtype, device: torch.device) -> tuple[bool, str]:
    """Whether elementwise `fn` computes each value the same way wherever it lies in a tensor: over every
    16-bit pattern (fp32: 2**20 spread patterns plus the special values), contiguous against strided."""
    if dtype in (torch.bfloat16, torch.float16):
        values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).to(device)
        bits = torch.int16
    elif dtype == torch.float32:
        generator = torch.Generator().manual_seed(0)
        patterns = torch.randint(-2**31, 2**31 - 1, (1 << 20,), generator=generator, dtype=torch.int64)
        values = patterns.to(torch.int32).view(torch.float32)
        special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-45, 88.7, -88.7, 1.0, -1.0])
        values = torch.cat([values, special, torch.randn(1 << 16, generator=generator) * 8]).to(device)
        bits = torch.int32
    else:
        return False, f"no position check for {dtype}"
    contiguous = fn(values.clone())
    spread = torch.zeros(values.numel() * 2, dtype=dtype, device=device)
    spread[::2] = values
    strided = fn(spread[::2])
    a, b = contiguous.view(bits), strided.contiguous().view(bits)
    nan = torch.isnan(contiguous) & torch.isnan(strided)
    differ = int(((a != b) & ~nan).sum())
    if differ:
        return False, (f"{getattr(fn, '__name__', fn)} on {device} in {dtype} gives {differ} values differently in "
                       "a tensor's vectorized body and its scalar tail")
    return True, ""


@dataclasses.dataclass
class BandStats:
    local: int = 0           # band-local op calls
    gathered: int = 0        # op calls on the gathered whole tensor (attention included)
    checks: int = 0          # local checks run in this call
    reasons: list = dataclasses.field(default_factory=list)  # why ops were gathered (once per shape)


class BandRun:
    """One sharded decode's band geometry, its collectives and the verdicts it uses."""

    def __init__(self, comm, latent_rows: list[tuple[int, int]]) -> None:
        self.comm = comm
        self.rows = latent_rows
        self.height = latent_rows[-1][1]
        self.rank = comm.rank
        self.stats = BandStats()
        self.agreed = _AGREED.setdefault((comm.name, comm._global), {})

    # ---- geometry -------------------------------------------------------------------------------------
    def scale(self, local_height: int) -> int:
        a, b = self.rows[self.rank]
        s, rest = divmod(local_height, b - a)
        if rest or s < 1:
            raise RuntimeError(f"sharded decode: a band of {local_height} rows is no multiple of the latent band "
                               f"{b - a}")
        return s

    def rows_at(self, s: int) -> list[tuple[int, int]]:
        return [(s * a, s * b) for a, b in self.rows]

    def own(self, out: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a whole tensor (rows in dim -2), dense in its layout."""
        s, rest = divmod(out.shape[-2], self.height)
        if rest:
            raise RuntimeError(f"sharded decode: {out.shape[-2]} rows is no multiple of the latent height "
                               f"{self.height}")
        a, b = self.rows_at(s)[self.rank]
        return compact_like(out[..., a:b, :], out)

    def gather(self, x: torch.Tensor, what: str) -> torch.Tensor:
        """The whole tensor of which `x` is this rank's band, on every rank, in `x`'s layout."""
        s = self.scale(x.shape[-2])
        heights = [b - a for a, b in self.rows_at(s)]
        return compact_like(self.comm.gather_rows(x, heights, what), x)

    # ---- verdicts -------------------------------------------------------------------------------------
    def verdict(self, key: tuple, check, local: tuple = ()) -> bool:
        """Whether every rank's band form of the op `key` names passed its check (`check() -> (ok, reason)`,
        run once per process for `key` and this rank's band and `local` layout); agreed across ranks on the
        first use of `key` in this group. `key` must be the same on every rank (no local strides: a band of
        one row has an ambiguous dim order), `local` may differ."""
        local_key = key + (self.rank, self.rows[self.rank], local)
        if local_key not in _LOCAL:
            self.stats.checks += 1
            try:
                with torch.no_grad():
                    _LOCAL[local_key] = check()
            except Exception as error:  # noqa: BLE001 - a check that cannot run admits nothing
                _LOCAL[local_key] = (False, f"its check raised {type(error).__name__}: {error}")
        ok, reason = _LOCAL[local_key]
        agreed = self.agreed.get(key)
        if agreed is not None:
            if agreed and not ok:  # this rank's layout was not the one agreed on: no collective may change now
                raise RuntimeError(f"sharded decode: {key[0]} {key[1]} was admitted band-locally, but this rank's "
                                   f"band now has another memory layout that fails its check ({reason})")
            return agreed
        agreed = bool(self.comm.all_reduce_min(int(ok), f"the band verdict of {key[0]}"))
        self.agreed[key] = agreed
        if not agreed:
            why = reason if not ok else "another rank's band failed its check"
            text = f"{key[0]} {key[1]}: runs on the gathered whole tensor ({why})"
            self.stats.reasons.append(text)
            logger.warning("%s", text)
        return agreed

    def spatial_op(self, kind: str, signature: tuple, x: torch.Tensor, halo: int, band_fn, whole_fn):
        """Run `band_fn(x, top, bottom)` (halo rows from the neighbours, None at global edges) where admitted,
        else `whole_fn` on the gathered tensor and keep the own rows."""
        s = self.scale(x.shape[-2])
        rows = self.rows_at(s)
        shape = list(x.shape)
        shape[-2] = rows[-1][1]
        fits = halo <= min(b - a for a, b in rows)
        key = (kind, tuple(shape), str(x.dtype), layout_key(x), signature, tuple(rows), halo,
               backend_settings(x.device))
        check = functools.partial(self._spatial_check, shape, x, halo, band_fn, whole_fn, rows)
        if fits and self.verdict(key, check, local=tuple(x.stride())):
            self.stats.local += 1
            top = bottom = None
            if halo:
                top, bottom = self.comm.exchange_halo(x, halo, f"the halo exchange of {kind}")
            return band_fn(x, top, bottom)
        self.stats.gathered += 1
        return self.own(whole_fn(self.gather(x, f"the gather of {kind}")))

    def _spatial_check(self, shape, like, halo, band_fn, whole_fn, rows):
        whole_in = seeded_random(shape, like, seed=len(shape) * 7919 + shape[-2])
        whole = whole_fn(whole_in)
        a, b = rows[self.rank]
        piece = compact_like(whole_in[..., a:b, :], like)
        top = whole_in[..., a - halo:a, :].contiguous() if halo and self.rank > 0 else None
        bottom = whole_in[..., b:b + halo, :].contiguous() if halo and self.rank < len(rows) - 1 else None
        band = band_fn(piece, top, bottom)
        expected = whole[..., a:b, :]
        if band.shape != expected.shape:
            return False, f"the band form gives {tuple(band.shape)}, the whole op's rows {tuple(expected.shape)}"
        if not torch.equal(band, expected):
            return False, (f"the band form of rows {a}:{b} differs from the same rows of the whole op "
                           f"(input {tuple(like.shape)} of {tuple(shape)}, {like.dtype}, {like.device})")
        return True, ""


# ---- the band forwards (installed on the decoder copy) ----------------------------------------------
def _cat_rows(top, x, bottom):
    parts = [t for t in (top, x, bottom) if t is not None]
    return torch.cat(parts, -2) if len(parts) > 1 else x


def band_causal_conv3d(run: BandRun, m: nn.Module, x: torch.Tensor, cache_x=None) -> torch.Tensor:
    """`WanCausalConv3d.forward` on a band: the cache concatenated as diffusers does, a halo of the row pad."""
    padding = list(m._padding)  # (w, w, h, h, t_front, t_back)
    if cache_x is not None and padding[4] > 0:
        cache_x = cache_x.to(x.device)
        x = torch.cat([cache_x, x], dim=2)
        padding[4] -= cache_x.shape[2]
    halo = padding[2]
    local = (padding[2] == padding[3] and tuple(m.padding) == (0, 0, 0) and m.stride[1] == 1
             and m.dilation[1] == 1 and m.kernel_size[1] == 2 * halo + 1 and m.padding_mode == "zeros")

    def whole_fn(xw):
        return nn.Conv3d.forward(m, F.pad(xw, padding))

    def band_fn(xb, top, bottom):
        pads = list(padding)
        pads[2] = padding[2] if top is None else 0
        pads[3] = padding[3] if bottom is None else 0
        return nn.Conv3d.forward(m, F.pad(_cat_rows(top, xb, bottom), pads))

    signature = ("conv3d", tuple(m.weight.shape), str(m.weight.dtype), m.bias is not None, tuple(padding),
                 tuple(m.stride), tuple(m.dilation), m.groups)
    if not local:
        return run.spatial_op("conv3d", signature, x, 1 << 30, band_fn, whole_fn)  # no band form: gathered
    return run.spatial_op("conv3d", signature, x, halo, band_fn, whole_fn)


def band_conv2d(run: BandRun, m: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """A resampler's 3x3 `nn.Conv2d` (frames folded into the batch) on a band: row pad as a halo."""
    ph, pw = m.padding if isinstance(m.padding, tuple) else (None, None)
    local = (isinstance(ph, int) and m.padding_mode == "zeros" and tuple(m.stride) == (1, 1)
             and tuple(m.dilation) == (1, 1) and m.kernel_size[0] == 2 * ph + 1)

    def whole_fn(xw):
        return nn.Conv2d.forward(m, xw)

    def band_fn(xb, top, bottom):
        padded = F.pad(_cat_rows(top, xb, bottom), (0, 0, ph if top is None else 0, ph if bottom is None else 0))
        return F.conv2d(padded, m.weight, m.bias, m.stride, (0, pw), m.dilation, m.groups)

    signature = ("conv2d", tuple(m.weight.shape), str(m.weight.dtype), m.bias is not None, str(m.padding),
                 m.padding_mode, tuple(m.stride), tuple(m.dilation), m.groups)
    return run.spatial_op("conv2d", signature, x, ph if local else 1 << 30, band_fn, whole_fn)


def band_norm(run: BandRun, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`WanRMS_norm` (over channels) on the band."""
    forward = functools.partial(diffusers_wan().WanRMS_norm.forward, m)
    signature = ("rms_norm", tuple(m.gamma.shape), str(m.gamma.dtype), m.channel_first, float(m.scale),
                 not isinstance(m.bias, float))
    return run.spatial_op("rms_norm", signature, x, 0, lambda xb, _t, _b: forward(xb), forward)


def band_silu(run: BandRun, m: nn.SiLU, x: torch.Tensor) -> torch.Tensor:
    """SiLU on the band where the device computes it the same at every position, else gathered."""
    def silu(t):
        return F.silu(t, inplace=m.inplace)

    key = ("silu", str(x.dtype), backend_settings(x.device))
    if run.verdict(key, lambda: position_independent(F.silu, x.dtype, x.device)):
        run.stats.local += 1
        return silu(x)
    run.stats.gathered += 1
    return run.own(silu(run.gather(x, "the gather of silu")))


def band_attention(run: BandRun, m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The middle block's attention: all-gathered input, the whole block, the own rows."""
    run.stats.gathered += 1
    whole = run.gather(x, "the gather of the attention input")
    return run.own(diffusers_wan().WanAttentionBlock.forward(m, whole))


def band_decoder(decoder: nn.Module, run: BandRun):
    """(copy, None): a `tracing_copy` of `decoder` whose modules run band-locally; or (None, reason) where a
    module has no band form (a type or setting this file does not know)."""
    wan = diffusers_wan()
    copy = tracing_copy(decoder)
    inside_attention = {id(sub) for mod in copy.modules() if type(mod) is wan.WanAttentionBlock
                        for sub in mod.modules() if sub is not mod}
    resample_convs = {id(mod.resample[1]) for mod in copy.modules()
                      if type(mod) is wan.WanResample and isinstance(mod.resample, nn.Sequential)
                      and len(mod.resample) == 2 and type(mod.resample[1]) is nn.Conv2d}
    for name, mod in copy.named_modules(prefix="decoder"):
        if id(mod) in inside_attention:
            continue
        kind = type(mod)
        if kind is wan.WanCausalConv3d:
            mod.forward = functools.partial(band_causal_conv3d, run, mod)
        elif kind is nn.Conv2d and id(mod) in resample_convs:
            mod.forward = functools.partial(band_conv2d, run, mod)
        elif kind is wan.WanRMS_norm:
            mod.forward = functools.partial(band_norm, run, mod)
        elif kind is nn.SiLU:
            mod.forward = functools.partial(band_silu, run, mod)
        elif kind is wan.WanAttentionBlock:
            mod.forward = functools.partial(band_attention, run, mod)
        elif kind is wan.WanResample:
            if mod.mode not in ("upsample2d", "upsample3d"):
                return None, f"{name}: a {mod.mode!r} resampler has no band form"
        elif kind is wan.WanUpsample:
            if mod.mode != "nearest-exact" or tuple(mod.scale_factor or ()) != (2.0, 2.0) or mod.size is not None:
                return None, f"{name}: only nearest-exact x2 upsampling is band-local (got {mod.mode!r})"
        else:
            reason = passive_reason(name, mod)
            if reason is not None:
                return None, reason
    return copy, None


def passive_reason(name: str, mod: nn.Module) -> str | None:
    """Why a module that needs no band forward of its own (containers, blocks whose children have them,
    DupUp3D's data movement, identity, SiLU, eval dropout) cannot run on a band as it is; None where it can."""
    wan = diffusers_wan()
    passive = (wan.WanDecoder3d, wan.WanMidBlock, wan.WanUpBlock, wan.WanResidualUpBlock, wan.WanResidualBlock,
               nn.Sequential, nn.ModuleList, nn.Identity, nn.Dropout, nn.SiLU)
    kind = type(mod)
    if kind is wan.DupUp3D:
        return None if mod.factor_s in (1, 2) else f"{name}: DupUp3D with factor_s {mod.factor_s}"
    if kind not in passive:
        return f"{name}: {kind.__name__} has no band form"
    if kind is nn.Dropout and mod.p and mod.training:
        return f"{name}: active dropout"
    return None


def cache_slots(decoder: nn.Module) -> int:
    return sum(isinstance(m, diffusers_wan().WanCausalConv3d) for m in decoder.modules())
