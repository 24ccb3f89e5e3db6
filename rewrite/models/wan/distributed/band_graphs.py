"""The band mode through rewritten step graphs: each rank's band decoded by the `lossless` passes' custom ops.

What the eager band mode (`rewrite.models.wan.distributed.bands`) runs module by module, this runs as the project's
two step graphs (`rewrite.models.wan.capture`), exported for the band and rewritten by the optimized module's own
pass pipeline at `lossless`. The band is exported in *halo-first form*, so that every fusion family still
matches (the graphs differ from single-process graphs by the band ops of `rewrite.models.wan.distributed.band_ops`,
which no pattern crosses):

* the step input is the latent band with one extra row above and below (the neighbours' rows of the latent,
  which every rank holds; zeros at the global edges), so `conv_in`'s input and cache carry their halo;
* every norm that feeds a 3x3x3 causal conv (a residual block's `norm1`/`norm2`, `norm_out`) reads its input
  as a halo row band (`band_ops.halo_rows`), and those convs pad only columns and frames: the halo rows *are*
  their row pad (the norm and SiLU of a zero row are zero, so the zero rows at the global edges are the zero
  pad), and the caches they keep carry the halo rows too, so no cache is exchanged;
* a resampler's 2x upsample reads its input as a halo row band; its 3x3 conv2d pads only columns and the
  one extra output row on each side is cut off;
* the middle block's attention runs on its all-gathered input (`rewrite::band_gather_rows`), its output cut
  to this rank's rows (`rewrite::band_own_rows`);
* a conv whose band form is not exact for its shape (cuDNN picks kernels by shape) runs gathered instead,
  as the single-process conv on the whole tensor (`rewrite.models.wan.distributed.band_convs`: checked per call shape
  after a first export, the failing calls exported again gathered, the union taken over the ranks).

After the passes, each norm of a halo band is given the whole tensor's summation order (`norm_rows`,
`whole_norm_orders`): ATen's order for one output depends on how many outputs the tensor has, and the
single-process decode sums in the whole tensor's.

Exactness: the same values reach every op as in the eager band mode; what may differ is a kernel chosen
from a shape. So a graph pair serves only after it was seen to agree: on its first decodes (per band shape,
dtype, device and rank geometry) both modes run, the eager band mode's result is the one used, and the
chunk-0 step and two steady steps must be `torch.equal` (the output, and each cache's band rows); all ranks
agree on the verdict (a MIN all-reduce). A pair that disagrees anywhere is never used again (logged, with
the step); a capture that fails is remembered likewise. Like every self-check of the project this is
evidence per shape on one input, not a proof for all values (docs/distributed.md).

On CUDA a verified pair is then replayed from CUDA-graph segments between its collectives
(`rewrite.models.wan.distributed.band_segments`), which serve alone only after chunk 0 and two steady steps were
`torch.equal` to the pair run op by op (frames and caches), agreed over the ranks likewise.

Not here: `channels_last`'s own ops (the graphs are rewritten at `lossless` whatever the module's level, which
keeps the sharded decode `torch.equal` to the eager band mode).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import weakref
import zlib

import torch
from torch import nn

from rewrite.capture.export import tracing_copy
from rewrite.models.wan.capture import export_wan_steps, reference_forward
from rewrite.models.wan.distributed import band_ops  # noqa: F401 - registers the collective ops before any export
from rewrite.models.wan.distributed.band_convs import ConvForms, causal_conv_forward, check_call, resample_forward
from rewrite.models.wan.distributed.band_ops import COLLECTIVES, BandContext, halo_rows
from rewrite.models.wan.distributed.band_segments import CudaSegments, SegmentedBandSteps
from rewrite.models.wan.distributed.bands import (BandRun, backend_settings, cache_slots, diffusers_wan, passive_reason,
                                      zero_padded_rows)
from rewrite.runtime import guards
from rewrite.runtime.captures import CaptureCache
from rewrite.runtime.graphs import describe_key
from rewrite.runtime.runner import MAX_RECAPTURES
from rewrite.models.wan.frames import finish_video, store_frames, temporal_factor

logger = logging.getLogger("rewrite.models.wan.distributed")

#: the level the band graphs are rewritten at (see the module docstring)
BAND_LEVEL = "lossless"
#: steady steps a graph pair must agree on before it serves alone
STEADY_CHECKS = 2
#: exports of one pair, and agreement rounds over the ranks, before the convs to gather must have settled
MAX_EXPORTS = 3

ops = torch.ops.rewrite


# ---- the halo-first band decoder (exported) ------------------------------------------------------------
def _halo_norm(m: nn.Module, context_id: int, x: torch.Tensor) -> torch.Tensor:
    return diffusers_wan().WanRMS_norm.forward(m, halo_rows(x, context_id))


def _gathered_attention(m: nn.Module, context_id: int, x: torch.Tensor) -> torch.Tensor:
    whole = ops.band_gather_rows(x, context_id)
    return ops.band_own_rows(diffusers_wan().WanAttentionBlock.forward(m, whole), context_id)


def _is_3x3_causal(m: nn.Module) -> bool:
    return tuple(m.kernel_size[1:]) == (3, 3) and tuple(m._padding[:4]) == (1, 1, 1, 1)


def _is_pointwise_in_space(m: nn.Module) -> bool:
    return tuple(m.kernel_size[1:]) == (1, 1) and tuple(m._padding[:4]) == (0, 0, 0, 0)


def halo_first_decoder(decoder: nn.Module, ctx: BandContext, forms: ConvForms):
    """(copy, None): a `tracing_copy` of `decoder` in halo-first band form (module docstring), to export, each
    spatial conv in the form `forms` chooses (`band_convs`; `forms.paddings` gets the single-process
    `_padding` of each causal conv); or (None, reason) where a module or setting has no such form."""
    wan = diffusers_wan()
    copy = tracing_copy(decoder)
    named = dict(copy.named_modules(prefix="decoder"))
    inside_attention = {id(sub) for mod in named.values() if type(mod) is wan.WanAttentionBlock
                        for sub in mod.modules() if sub is not mod}
    resblock_parts = {id(getattr(mod, part)) for mod in named.values() if type(mod) is wan.WanResidualBlock
                      for part in ("norm1", "norm2", "conv1", "conv2")}
    head = {id(copy.norm_out), id(copy.conv_in), id(copy.conv_out)}
    in_resamplers = set()  # a resampler's upsample and conv2d: run by its Sequential's forward
    for name, mod in named.items():
        if id(mod) in inside_attention:
            continue
        kind = type(mod)
        if kind is wan.WanCausalConv3d:
            forms.paddings[name] = tuple(mod._padding)
            if _is_3x3_causal(mod) and (id(mod) in resblock_parts or id(mod) in head):
                padding = list(mod._padding)
                padding[2] = padding[3] = 0  # the halo rows are the row pad
                mod._padding = tuple(padding)
                halo = 1
            elif _is_pointwise_in_space(mod):
                halo = 0
            else:
                return None, f"{name}: a causal conv with kernel {tuple(mod.kernel_size)} there has no halo-first form"
            mod.forward = functools.partial(causal_conv_forward, mod, forms, name, halo, forms.paddings[name])
        elif kind is wan.WanRMS_norm:
            if not (id(mod) in resblock_parts or id(mod) in head) or not mod.channel_first:
                return None, f"{name}: a norm that feeds no 3x3x3 conv has no halo-first form"
            mod.forward = functools.partial(_halo_norm, mod, ctx.id)
        elif kind is wan.WanAttentionBlock:
            mod.forward = functools.partial(_gathered_attention, mod, ctx.id)
        elif kind is wan.WanResample:
            if mod.mode not in ("upsample2d", "upsample3d"):
                return None, f"{name}: a {mod.mode!r} resampler has no band form"
            up, conv = (mod.resample[0], mod.resample[1]) if len(mod.resample) == 2 else (None, None)
            if (type(up) is not wan.WanUpsample or type(conv) is not nn.Conv2d or tuple(conv.kernel_size) != (3, 3)
                    or tuple(conv.padding) != (1, 1) or tuple(conv.stride) != (1, 1) or tuple(conv.dilation) != (1, 1)
                    or conv.padding_mode != "zeros"):
                return None, f"{name}: only a 2x upsample followed by a 3x3 conv2d (padding 1) has a halo-first form"
            if (up.mode != "nearest-exact" or tuple(up.scale_factor or ()) != (2.0, 2.0) or up.size is not None):
                return None, f"{name}: only a resampler's nearest-exact x2 upsampling is band-local"
            mod.resample.forward = functools.partial(resample_forward, mod.resample, forms, f"{name}.resample")
            in_resamplers |= {id(mod.resample), id(up), id(conv)}
        elif id(mod) in in_resamplers:
            continue
        elif kind is wan.WanUpsample:
            return None, f"{name}: only a resampler's nearest-exact x2 upsampling is band-local"
        elif kind is nn.Conv2d:
            return None, f"{name}: a conv2d outside a resampler has no band form"
        else:
            reason = passive_reason(name, mod)
            if reason is not None:
                return None, reason
    return copy, None


def whole_norm_orders(gm: torch.fx.GraphModule, ctx: BandContext) -> int:
    """Give every norm of a halo row band (`rewrite::rms_norm` / `rms_norm_causal_conv3d` reading a
    `band_halo_unpack` output) the summation order of the whole tensor it is a band of (`norm_rows`): ATen's
    order for one output depends on the tensor's output count (Wan 2.2's 1024-channel norms split each
    output over 10 blocks for the whole 720p tensor, 16 for a 2-rank band), and the single-process decode
    sums in the whole tensor's order. Returns the number of norms given it."""
    a, b = ctx.rows[ctx.rank]
    height = ctx.rows[-1][1]
    norms = (ops.rms_norm.default, ops.rms_norm_causal_conv3d.default)
    given = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in norms:
            continue
        x = node.args[0]
        if not (isinstance(x, torch.fx.Node) and x.target is ops.band_halo_unpack.default):
            continue
        rows = x.meta["val"].shape[-2] - 2
        scale, rest = divmod(int(rows), b - a)
        if rest or scale < 1:
            raise RuntimeError(f"band graphs: a norm input of {rows} band rows is no multiple of the band {b - a}")
        node.kwargs = {**node.kwargs, "norm_rows": scale * height}
        given += 1
    gm.recompile()
    return given


# ---- captured pairs, per runner -------------------------------------------------------------------------
@dataclasses.dataclass
class Checks:
    """How far a candidate's steps were seen to agree with a reference's (`STEADY_CHECKS` steady steps after
    chunk 0), or why it was refused; the same on every rank (`agree`)."""

    chunk0_ok: bool = False
    steady_checks: int = 0
    refused: str | None = None

    @property
    def verified(self) -> bool:
        return self.chunk0_ok and self.steady_checks >= STEADY_CHECKS

    def needs(self, i: int) -> bool:
        return not self.chunk0_ok if i == 0 else self.steady_checks < STEADY_CHECKS

    def needed_within(self, frames: int) -> bool:
        """Whether a clip of `frames` latent frames has a step still to check (else its reference need not
        run: a 1-frame clip after chunk 0 was checked runs the candidate alone)."""
        return any(self.needs(i) for i in range(min(frames, 2)))

    def passed(self, i: int) -> None:
        if i == 0:
            self.chunk0_ok = True
        else:
            self.steady_checks += 1

    def agree(self, comm, what: str) -> None:
        """Take the least progress of any rank (a steady check implies chunk 0's), so all run the same checks."""
        progress = comm.all_reduce_min(int(self.chunk0_ok) + min(self.steady_checks, STEADY_CHECKS), what)
        self.chunk0_ok, self.steady_checks = progress >= 1, max(progress - 1, 0)


@dataclasses.dataclass
class BandGraphs:
    """One rewritten (chunk0, steady) pair for a band shape, whether it was seen to agree with the eager band
    mode (`checks`), and its CUDA-graph segments where captured (`segments`, checked against the pair)."""

    ctx: BandContext
    chunk0: object
    steady: object
    snapshot: guards.ModuleSnapshot
    forms: ConvForms  # which conv calls run gathered (`band_convs`)
    gathers_agreed: bool = False  # every rank's pair gathers the same calls (`agree_on_gathers`)
    checks: Checks = dataclasses.field(default_factory=Checks)
    segments: object = None
    segments_mode: str | None = None  # the `cuda_graphs` mode `segments` were captured for
    segment_checks: Checks = dataclasses.field(default_factory=Checks)
    #: per mode: why no captured steps serve (a capture failed somewhere, refused, not possible), logged once
    segment_reasons: dict = dataclasses.field(default_factory=dict)
    segments_logged: set = dataclasses.field(default_factory=set)

    @property
    def refused(self) -> str | None:
        return self.checks.refused


class BandGraphStore:
    """The band graph pairs of one optimized module (one `WanRunner`), keyed by band shape and geometry."""

    def __init__(self) -> None:
        self.captures: CaptureCache = CaptureCache()
        #: captures the CUDA-graph segments (`band_segments.CudaSegments`; tests: a CPU stand-in)
        self.segment_backend = CudaSegments()
        #: checks one conv call's band form (`band_convs.check_call`; tests: one that fails chosen calls)
        self.conv_check = check_call
        #: the conv checks' verdicts: (call, rows, rank, dtype, device, settings) -> (ok, reason)
        self.conv_verdicts: dict[tuple, tuple[bool, str]] = {}
        #: captures again after a module change, per key (at most `MAX_RECAPTURES`)
        self.recaptures: collections.Counter = collections.Counter()

    def pair(self, runner, decoder: nn.Module, key: tuple, rows, rank: int, size, dtype, device, forced=()):
        """The pair of `key` (None with the reason where its capture failed or it was refused); `forced`:
        conv calls to gather whatever their checks say (the ranks' union, `agree_on_gathers`)."""
        listing = list(decoder.named_modules(prefix="decoder"))
        what = f"the band graphs of rank {rank} at latent size {size}"
        found = self.captures.values.get(key)
        changes = found.snapshot.changes(listing) if found is not None else []
        if changes:  # the module tree changed since its capture: capture again, a bounded number of times
            self.recaptures[key] += 1
            self.captures.forget(key)
            if self.recaptures[key] > MAX_RECAPTURES:
                self.captures.errors[key] = (f"the decoder changed after {MAX_RECAPTURES} recaptures of {what} "
                                             f"({'; '.join(changes)}); the eager band mode serves it from now on")
                logger.warning("%s", self.captures.errors[key])
        elif found is not None and not set(forced) <= found.forms.gathered:
            self.captures.forget(key)  # more convs must gather (the ranks' union)

        def capture():
            gathered = set(forced)
            for _ in range(MAX_EXPORTS):
                ctx = BandContext(rows, rank)
                forms = ConvForms(ctx.id, gathered)
                traced, reason = halo_first_decoder(decoder, ctx, forms)
                if traced is None:
                    raise ValueError(reason)
                chunk0, steady = export_wan_steps(traced, dtype, device, size)
                modules = dict(traced.named_modules(prefix="decoder"))
                failing = {call for call in forms.calls
                           if call not in gathered and not self._band_form_ok(call, modules, forms, rows, rank, dtype,
                                                                               device)}
                if not failing:
                    break
                gathered |= failing  # export again with those convs gathered
            else:
                raise ValueError(f"the conv calls to gather did not settle within {MAX_EXPORTS} exports")
            for graph in (chunk0, steady):
                runner.rewrite_graph(graph, BAND_LEVEL)
                whole_norm_orders(graph.graph_module, ctx)
            return BandGraphs(ctx, chunk0, steady, guards.ModuleSnapshot.of(listing), forms)

        graphs = self.captures.get(key, capture, what)
        if graphs is None:
            return None, self.captures.errors[key]
        return graphs, graphs.refused

    def _band_form_ok(self, call, modules: dict, forms: ConvForms, rows, rank: int, dtype, device) -> bool:
        """Whether `call`'s band form passed its check (run once per call and geometry); `modules`: the traced
        decoder copy's modules by name."""
        key = (call, tuple(rows), rank, dtype, device, backend_settings(device))
        if key not in self.conv_verdicts:
            like = torch.empty(0, dtype=dtype, device=device)
            try:
                self.conv_verdicts[key] = self.conv_check(call, modules[call.module], forms.paddings.get(call.module),
                                                          rows, rank, like)
            except Exception as error:  # noqa: BLE001 - a check that cannot run admits nothing
                self.conv_verdicts[key] = (False, f"{call.describe()}: its check raised {type(error).__name__}: "
                                                  f"{error}")
            ok, reason = self.conv_verdicts[key]
            if not ok:
                logger.info("band graphs gather %s", reason)
        return self.conv_verdicts[key][0]


def agree_on_gathers(graphs: BandGraphs, run: BandRun, recapture):
    """(graphs, None) whose gathered conv calls are the same on every rank (the union of the ranks' own:
    each gather is a collective), captured again by `recapture(forced)` where this rank's lacked some, and
    marked `gathers_agreed`; or (None, reason) on every rank where the ranks' calls do not line up or a
    capture failed. Collective."""
    for _ in range(MAX_EXPORTS):
        calls = graphs.forms.calls
        signature = zlib.crc32("|".join(f"{c.module}:{c.kind}" for c in calls).encode())
        shapes = run.comm.all_gather_vector(torch.tensor([len(calls), signature]), "the band graphs' conv calls")
        if any(not torch.equal(v, shapes[0]) for v in shapes):
            return None, "the ranks' band graphs make different conv calls"
        flags = torch.tensor([int(c in graphs.forms.gathered) for c in calls], dtype=torch.int64)
        every = run.comm.all_gather_vector(flags, "the band graphs' gathered convs")
        union = torch.stack(every).amax(0)
        if all(torch.equal(v, union) for v in every):
            graphs.gathers_agreed = True
            return graphs, None
        graphs, reason = recapture({c for c, f in zip(calls, union.tolist()) if f})
        ok = run.comm.all_reduce_min(int(graphs is not None and reason is None), "the choice of the band graphs")
        if not ok:
            return None, reason or "another rank has no band graphs with the gathered convs of all ranks"
    return None, f"the ranks' gathered convs did not settle within {MAX_EXPORTS} captures"


def _progress(checks: Checks) -> str:
    if checks.refused:
        return f"refused ({checks.refused})"
    if checks.verified:
        return "serving"
    return f"checked {int(checks.chunk0_ok) + checks.steady_checks} of {1 + STEADY_CHECKS} steps"


def describe(runner) -> list[str]:
    """One line per band graph pair of `runner` (for `rewrite.report`): band geometry, shape, dtype and device,
    the pair's state and its captured steps' state."""
    store = _STORES.get(runner)
    lines = []
    for key, graphs in ([] if store is None else store.captures.values.items()):
        dtype, device, (batch, ext_rows, width), rows, rank = key[:5]
        a, b = rows[rank]
        captured = "none"
        if graphs.segments is not None:
            captured = f"{graphs.segments_mode}: {_progress(graphs.segment_checks)}"
        elif graphs.segment_reasons:
            captured = "; ".join(f"{mode} off ({why})" for mode, why in graphs.segment_reasons.items())
        lines.append(f"rank {rank} of {len(rows)}, latent rows {a}:{b}, step input "
                     f"{describe_key((batch, ext_rows, width, dtype, device))}: graphs {_progress(graphs.checks)}, "
                     f"{len(graphs.forms.gathered)} of {len(graphs.forms.calls)} conv calls gathered; "
                     f"captured steps {captured}")
    if store is not None:
        lines += [f"capture failed: {error}" for error in store.captures.errors.values()]
    return lines


_STORES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # runner -> BandGraphStore


def store_of(runner) -> BandGraphStore:
    store = _STORES.get(runner)
    if store is None:
        store = _STORES[runner] = BandGraphStore()
    return store


# ---- the decode ------------------------------------------------------------------------------------------
def halo_latent(x: torch.Tensor, run: BandRun) -> torch.Tensor:
    """Latent rows [a - 1, b + 1) of the whole `x` (zeros beyond the global edges), dense in x's layout."""
    a, b = run.rows[run.rank]
    return zero_padded_rows(x, a - 1, b + 1)


def _caches_agree(graph_caches, eager_slots) -> bool:
    """Each graph cache's band rows equal to the eager mode's cache (the graph's may carry 2 halo rows more)."""
    tensors = [s for s in eager_slots if isinstance(s, torch.Tensor)]
    if len(tensors) != len(eager_slots) or len(tensors) != len(graph_caches):
        return False
    for g, e in zip(graph_caches, tensors):
        if g.shape[-2] == e.shape[-2] + 2:
            g = g[..., 1:-1, :]
        if g.shape != e.shape or not torch.equal(g, e):
            return False
    return True


def _caches_equal(ours, theirs) -> bool:
    return len(ours) == len(theirs) and all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(ours, theirs))


class _EagerBandSteps:
    """The eager band mode, step by step (diffusers' frame loop over the band decoder copy)."""

    name = "the eager band mode"

    def __init__(self, decoder: nn.Module, x_band: torch.Tensor) -> None:
        self.decoder, self.x, self.slots = decoder, x_band, [None] * cache_slots(decoder)

    def step(self, i: int) -> torch.Tensor:
        return reference_forward(self.decoder, self.x[:, :, i:i + 1], feat_cache=self.slots, feat_idx=[0],
                                 first_chunk=i == 0)


class _GraphSteps:
    """The band graphs run op by op, the caches handed from one step to the next."""

    name = "the band graphs"

    def __init__(self, graphs: BandGraphs, weights0, weights, x_ext: torch.Tensor) -> None:
        self.graphs, self.weights0, self.weights, self.x, self.caches = graphs, weights0, weights, x_ext, []

    def step(self, i: int) -> torch.Tensor:
        frame = self.x[:, :, i:i + 1]
        if i == 0:
            y, *self.caches = self.graphs.chunk0(self.weights0, frame)
        else:
            y, *self.caches = self.graphs.steady(self.weights, frame, *self.caches)
        return y


class _ReplaySteps:
    """The band graphs' CUDA-graph segments (`band_segments.SegmentedBandSteps`) replayed."""

    name = "the band graphs' CUDA-graph segments"

    def __init__(self, segments, x_ext: torch.Tensor) -> None:
        self.segments, self.x = segments, x_ext

    def step(self, i: int) -> torch.Tensor:
        frame = self.x[:, :, i:i + 1]
        return self.segments.first(frame) if i == 0 else self.segments.next(frame)

    @property
    def caches(self):
        return self.segments.caches


def decode_band_graphs(vae, eager_decoder: nn.Module, run: BandRun, z: torch.Tensor, runner, stats: dict,
                       cuda_graphs: str = "segments"):
    """This rank's band of the clamped video through the band graphs (eager band mode alongside until the pair
    is verified; on CUDA then captured, the graphs alongside until the captured steps are verified); None
    where no pair serves (its capture failed or it was refused: the caller runs the eager band mode). `stats`
    gets "graph_steps", "replayed_steps", "checked_steps" and "reason". `cuda_graphs` (`CUDA_GRAPH_MODES`):
    "segments" (captured between the collectives), "whole" (each step one graph, its collectives inside:
    NCCL only) or "off" (the graphs run op by op)."""
    decoder = vae.decoder
    x_whole = vae.post_quant_conv(z)
    a, b = run.rows[run.rank]
    batch, _, frames, _, width = x_whole.shape
    size = (batch, b - a + 2, width)
    key = (x_whole.dtype, x_whole.device, size, tuple(run.rows), run.rank, run.comm.name, run.comm._global)
    if runner is None:
        graphs, reason = None, "the module is not optimized (rewrite.optimize): no pass pipeline"
    else:
        graphs, reason = store_of(runner).pair(runner, decoder, key, run.rows, run.rank, size, x_whole.dtype,
                                               x_whole.device)
    # 0: some rank has no pair; 1: the ranks must agree on the convs to gather; 2: every rank's pair agreed
    state = 0 if graphs is None or reason is not None else 2 if graphs.gathers_agreed else 1
    state = run.comm.all_reduce_min(state, "the choice of the band graphs")
    if not state:
        stats["reason"] = reason or "another rank has no band graphs for this call"
        return None
    if state == 1:
        graphs, reason = agree_on_gathers(graphs, run, lambda forced: store_of(runner).pair(
            runner, decoder, key, run.rows, run.rank, size, x_whole.dtype, x_whole.device, forced))
        if graphs is None:
            refused = store_of(runner).captures.values.get(key)
            if refused is not None:  # remembered, so the next call does not try again
                refused.checks.refused = reason
            stats["reason"] = reason
            return None
    stats["gathered_convs"] = len(graphs.forms.gathered)
    x_ext = halo_latent(x_whole, run)
    graphs.ctx.run = run
    try:
        graph_steps = _GraphSteps(graphs, graphs.chunk0.weights(decoder), graphs.steady.weights(decoder), x_ext)
        temporal = temporal_factor(decoder)
        graphs.checks.agree(run.comm, "the state of the band graphs' checks")
        if not graphs.checks.verified:
            reference = None
            if graphs.checks.needed_within(frames):
                reference = _EagerBandSteps(eager_decoder, run.own(x_whole))
            video = _checked_steps(graph_steps, reference, graphs.checks, lambda c, r: _caches_agree(
                c.caches, r.slots[:len(c.caches)]), run, frames, temporal, stats)
            return finish_video(vae, video)
        segments = _segments(store_of(runner).segment_backend, graphs, graph_steps, x_ext, run, stats, cuda_graphs)
        if segments is None:
            return finish_video(vae, _checked_steps(graph_steps, None, None, None, run, frames, temporal, stats))
        graphs.segment_checks.agree(run.comm, "the state of the band graph segments' checks")
        reference = graph_steps if graphs.segment_checks.needed_within(frames) else None
        video = _checked_steps(_ReplaySteps(segments, x_ext), reference, graphs.segment_checks,
                               lambda c, r: _caches_equal(c.caches, r.caches), run, frames, temporal, stats)
        if graphs.segment_checks.refused:  # logged by the checks
            graphs.segments = None
            graphs.segment_reasons[cuda_graphs] = graphs.segment_checks.refused
            graphs.segments_logged.add(cuda_graphs)
        return finish_video(vae, video)
    finally:
        graphs.ctx.run = None


def _segments(backend, graphs: BandGraphs, graph_steps: _GraphSteps, x_ext, run: BandRun, stats: dict, mode: str):
    """The pair's captured steps for `mode`, captured on first use (and again after the weights moved or for
    another mode), or None (not CUDA, mode "off", or refused: the graphs run op by op). A capture that fails on
    any rank turns the mode off on all."""
    if mode == "off" or not backend.can_capture(x_ext.device):
        return None
    if mode == "whole" and run.comm.backend != "nccl" and isinstance(backend, CudaSegments):
        graphs.segment_reasons.setdefault(mode, f"{run.comm.backend} collectives cannot run inside a CUDA graph "
                                                "(cuda_graphs='whole' needs NCCL)")
    stale = (graphs.segments is None or graphs.segments_mode != mode
             or not graphs.segments.serves(graph_steps.weights0, graph_steps.weights))
    if mode not in graphs.segment_reasons and stale:
        graphs.segments = None
        try:
            graphs.segments = SegmentedBandSteps(graphs.chunk0, graphs.steady, graph_steps.weights0,
                                                 graph_steps.weights, x_ext[:, :, 0:1], backend,
                                                 COLLECTIVES if mode == "segments" else ())
            graphs.segments_mode, graphs.segment_checks = mode, Checks()
        except Exception as error:  # noqa: BLE001 - the graphs still serve, op by op
            graphs.segment_reasons[mode] = f"capturing the band graphs ({mode}) failed: {type(error).__name__}: {error}"
    ok = run.comm.all_reduce_min(int(graphs.segments is not None and mode not in graphs.segment_reasons),
                                 f"the choice of the captured band graphs ({mode})")
    if not ok:
        if mode not in graphs.segment_reasons:
            graphs.segment_reasons[mode] = f"another rank has no captured band graphs ({mode})"
        reason = graphs.segment_reasons[mode]
        if mode not in graphs.segments_logged:
            logger.warning("%s; the band graphs run op by op", reason)
            graphs.segments_logged.add(mode)
        graphs.segments = None
        stats["reason"] = reason
        return None
    return graphs.segments


def _checked_steps(candidate, reference, checks: Checks | None, caches_agree, run: BandRun, frames: int,
                   temporal: int, stats: dict):
    """Every step of the clip from `candidate`, and while `checks` are not complete from `reference` too, whose
    frames are then the ones used; a step that `checks` needs is compared (frames `torch.equal`, and from the
    first steady step `caches_agree(candidate, reference)`) and the verdict agreed over the ranks. A refused
    candidate is dropped for the rest of the clip (and `checks.refused` says why)."""
    video = None
    replays = isinstance(candidate, _ReplaySteps)
    for i in range(frames):
        y = None
        if candidate is not None:
            y = candidate.step(i)
            stats["graph_steps"] = stats.get("graph_steps", 0) + 1
            stats["replayed_steps"] = stats.get("replayed_steps", 0) + int(replays)
        if reference is not None:
            expected = reference.step(i)
            if candidate is not None and checks.needs(i):
                agree = torch.equal(y, expected) and (i == 0 or caches_agree(candidate, reference))
                agree = bool(run.comm.all_reduce_min(int(agree), f"the check of {candidate.name}"))
                stats["checked_steps"] = stats.get("checked_steps", 0) + 1
                if agree:
                    checks.passed(i)
                else:
                    checks.refused = (f"{candidate.name} differ from {reference.name} at step {i} "
                                      f"({'chunk 0' if i == 0 else 'steady'}) on some rank")
                    logger.warning("%s; %s serves this shape", checks.refused, reference.name)
                    stats["reason"] = checks.refused
                    candidate = None
            y = expected
            if candidate is not None and checks.verified:
                reference = None
        video = store_frames(video, y, i, frames, temporal)
    return video


#: what `decode_sharded(cuda_graphs=...)` takes (see `decode_band_graphs`)
CUDA_GRAPH_MODES = ("segments", "whole", "off")
