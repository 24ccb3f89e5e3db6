"""`rewrite.distributed.decode_sharded` over gloo: 2 and 3 ranks spawned from pytest, tiny Wan 2.1 / 2.2.

Each spawn runs many cases in its ranks (start-up, ~8 s a spawn on 2 cores, dominates) and each rank
writes what it saw; one test per spawn asserts every case (so pytest-xdist never runs a spawn twice). The
single-process reference is decoded inside the ranks, under the same thread count as the sharded decode.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import traceback

import pytest
import torch
import torch.multiprocessing as mp

SPAWN_LIMIT_S = 1200  # a hang guard: the two-rank cases take 90 s on an idle 2-core machine, 270 s on a loaded one


# ---- in-process units ---------------------------------------------------------------------------------
def test_split_rows_uneven_and_output_rows():
    from rewrite.distributed import output_rows, split_rows
    from rewrite.models.wan import build_wan

    assert split_rows(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert split_rows(4, 3) == [(0, 2), (2, 3), (3, 4)]
    assert split_rows(6, 2) == [(0, 3), (3, 6)]
    vae = build_wan("wan2.1", "tiny")
    assert output_rows(vae, 5, 2) == [(0, 24), (24, 40)]


def test_position_check_finds_cpu_silu_tails():
    import torch.nn.functional as F

    from rewrite.distributed.bands import position_independent

    ok, reason = position_independent(F.silu, torch.float16, torch.device("cpu"))
    assert ok, reason
    # the identity is trivially position independent; ATen's fp32 SiLU on AVX CPUs is not (exp differs
    # between its vectorized body and its scalar tail): either verdict is a property of the machine
    assert position_independent(lambda t: t.clone(), torch.float32, torch.device("cpu"))[0]


def test_checksum_is_order_free_and_names_a_change():
    from rewrite.distributed.decode import _checksum

    t = torch.randn(1000)
    assert [int(v) for v in _checksum(t)] == [int(v) for v in _checksum(t.clone())]
    u = t.clone()
    u[3], u[4] = t[4], t[3]  # a swap keeps the plain sum, not the weighted one
    assert _checksum(u)[0] == _checksum(t)[0] and _checksum(u)[1] != _checksum(t)[1]


def test_halo_first_decoder_and_halo_latent():
    """The exported band form: the 3x3x3 causal convs pad no rows (their halo rows are their row pad), the
    norms feeding them and the resamplers' upsamples read through the halo op, the attention gathers; the
    live decoder is untouched; a conv without that form is named. The halo latent has the neighbours' rows
    and zero rows at the global edges."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    from rewrite.distributed.band_convs import ConvForms
    from rewrite.distributed.band_graphs import halo_first_decoder, halo_latent
    from rewrite.distributed.band_ops import BandContext
    from rewrite.distributed.bands import BandRun
    from rewrite.models.wan import build_wan

    decoder = build_wan("wan2.1", "tiny").decoder
    ctx = BandContext([(0, 3), (3, 5)], 1)
    forms = ConvForms(ctx.id)
    copy, reason = halo_first_decoder(decoder, ctx, forms)
    assert reason is None
    assert copy.conv_in._padding == (1, 1, 0, 0, 2, 0) and decoder.conv_in._padding == (1, 1, 1, 1, 2, 0)
    assert forms.paddings["decoder.conv_in"] == (1, 1, 1, 1, 2, 0)
    assert copy.mid_block.resnets[0].norm1.forward.args == (copy.mid_block.resnets[0].norm1, ctx.id)
    assert "forward" in copy.up_blocks[0].upsamplers[0].resample.__dict__
    assert "forward" in copy.mid_block.attentions[0].__dict__
    assert not any("forward" in m.__dict__ for m in decoder.modules())
    decoder.conv_out = WanCausalConv3d(decoder.conv_out.in_channels, 3, 5, padding=2)
    reason = "decoder.conv_out: a causal conv with kernel (5, 5, 5) there has no halo-first form"
    assert halo_first_decoder(decoder, ctx, ConvForms(ctx.id)) == (None, reason)

    class Comm:  # the geometry only: halo_latent exchanges nothing
        rank, world, name, _global = 1, 2, "test", (0, 1)

    x = torch.arange(5.0).view(1, 1, 1, 5, 1).expand(1, 2, 3, 5, 2).contiguous()
    run = BandRun(Comm(), [(0, 3), (3, 5)])
    ext = halo_latent(x, run)
    assert ext[0, 0, 0, :, 0].tolist() == [2.0, 3.0, 4.0, 0.0] and ext.is_contiguous()
    run.rank = 0
    assert halo_latent(x, run)[0, 1, 2, :, 1].tolist() == [0.0, 0.0, 1.0, 2.0, 3.0]


class _StandInAlone:
    """The comm of a 1-rank band decode: the halo rows are the global edges' zeros, the gather is the band."""

    rank, world, name, _global = 0, 1, "alone", (0,)

    def exchange_edges(self, first, last, what):
        return None, None

    def gather_rows(self, x, heights, what):
        return x


def test_band_conv_forms_record_check_and_gather():
    """Each spatial conv of the halo-first decoder is recorded once per call shape; its check passes where the
    band form gives the whole conv's rows and names the call where it does not; and the gathered forms (every
    conv gathered) compute what the band forms do: on one rank, where the halo rows are the zero pad and the
    gather is the band, chunk 0 and two steady steps agree bit for bit, frames and caches (tiny Wan 2.1 bf16)."""
    from rewrite.capture.wan import export_wan_steps
    from rewrite.distributed.band_convs import (CAUSAL_HALO, CAUSAL_POINTWISE, RESAMPLE_HALO, ConvForms,
                                                check_call)
    from rewrite.distributed.band_graphs import halo_first_decoder
    from rewrite.distributed.band_ops import BandContext
    from rewrite.distributed.bands import BandRun
    from rewrite.models.wan import build_wan
    from rewrite.pipeline import rewrite_graph

    bf16 = torch.bfloat16
    decoder = build_wan("wan2.1", "tiny").decoder.to(bf16)
    ctx = BandContext([(0, 3), (3, 5)], 0)
    forms = ConvForms(ctx.id)
    traced, _ = halo_first_decoder(decoder, ctx, forms)
    export_wan_steps(traced, bf16, torch.device("cpu"), (1, 5, 6))
    kinds = [c.kind for c in forms.calls]
    assert len(set(forms.calls)) == len(forms.calls)
    # chunk 0 and steady: 22 3x3x3 convs each (conv_in, conv_out, 20 in residual blocks); 2 1x1x1 shortcuts
    # each, 2 time_convs in steady only (chunk 0 repeats the frame); 3 resamplers each
    assert (kinds.count(CAUSAL_HALO), kinds.count(CAUSAL_POINTWISE), kinds.count(RESAMPLE_HALO)) == (44, 6, 6)
    modules = dict(traced.named_modules(prefix="decoder"))
    like = torch.empty(0, dtype=bf16)
    call = next(c for c in forms.calls if c.module == "decoder.conv_in" and c.cache is not None)
    padding = forms.paddings["decoder.conv_in"]
    assert check_call(call, modules[call.module], padding, ctx.rows, 0, like) == (True, "")
    unpadded = (1, 1, 0, 0, 2, 0)  # a whole conv without its row pad: the band form's rows differ from it
    ok, reason = check_call(call, modules[call.module], unpadded, ctx.rows, 0, like)
    assert not ok and reason.startswith("decoder.conv_in (causal conv on a halo band, input (1, 4, 1, 5, 6))")

    alone = BandContext([(0, 5)], 0)
    alone.run = BandRun(_StandInAlone(), alone.rows)
    steps = []
    for gathered in (False, True):
        forms = ConvForms(alone.id)
        traced, _ = halo_first_decoder(decoder, alone, forms)
        export_wan_steps(traced, bf16, torch.device("cpu"), (1, 7, 6))
        if gathered:
            forms = ConvForms(alone.id, forms.calls)
            traced, _ = halo_first_decoder(decoder, alone, forms)
        chunk0, steady = export_wan_steps(traced, bf16, torch.device("cpu"), (1, 7, 6))
        for graph in (chunk0, steady):
            rewrite_graph(graph, "lossless")
        gathers = sum(n.target is torch.ops.rewrite.band_gather_rows.default for n in steady.graph_module.graph.nodes)
        steps.append((chunk0, steady, gathers))
    try:
        g = torch.Generator().manual_seed(0)
        frames = [torch.randn((1, 4, 1, 7, 6), generator=g).to(bf16) for _ in range(3)]
        for frame in frames:  # the step input's halo rows: zeros at the global edges (`halo_latent`)
            frame[..., 0, :] = frame[..., -1, :] = 0
        outputs = []
        with torch.no_grad():
            for chunk0, steady, _ in steps:
                y, *caches = chunk0(chunk0.weights(decoder), frames[0])
                seen = [y, *caches]
                for frame in frames[1:]:
                    y, *caches = steady(steady.weights(decoder), frame, *caches)
                    seen += [y, *caches]
                outputs.append(seen)
        assert (steps[0][2], steps[1][2]) == (1, 30)  # the attention's gather; then 22 + 4 + 3 convs' too
        assert len(outputs[0]) == len(outputs[1])
        assert all(torch.equal(a, b) for a, b in zip(*outputs))
    finally:
        alone.run = None


def test_band_graph_store_captures_again_a_bounded_number_of_times():
    """A band pair is captured again when the module tree changed, at most `MAX_RECAPTURES` times per key;
    then its key keeps the reason and the eager band mode serves (the graphs are not rewritten here: a
    runner whose passes do nothing)."""
    from torch import nn

    from rewrite.distributed.band_graphs import BandGraphStore
    from rewrite.models.wan import build_wan
    from rewrite.runtime.runner import MAX_RECAPTURES

    class Passless:
        def rewrite_graph(self, graph, level):
            pass

    bf16 = torch.bfloat16
    decoder = build_wan("wan2.1", "tiny").decoder.to(bf16)
    store, key, seen = BandGraphStore(), ("a key",), []
    for i in range(MAX_RECAPTURES + 2):
        graphs, reason = store.pair(Passless(), decoder, key, [(0, 3), (3, 5)], 0, (1, 5, 6), bf16,
                                    torch.device("cpu"))
        again, _ = store.pair(Passless(), decoder, key, [(0, 3), (3, 5)], 0, (1, 5, 6), bf16, torch.device("cpu"))
        seen.append((graphs is not None, again is graphs, reason))
        if i % 2:  # a module added, then removed again: each a change of the tree
            del decoder.extra
        else:
            decoder.extra = nn.Identity()
    assert seen[:-1] == [(True, True, None)] * (MAX_RECAPTURES + 1)
    last, why = seen[-1], seen[-1][2] or ""
    assert last[:2] == (False, True), seen
    assert why.startswith("the decoder changed after 3 recaptures of the band graphs of rank 0 at latent size "
                          "(1, 5, 6) (decoder children: ") and why.endswith(
                              "decoder.extra removed); the eager band mode serves it from now on"), why


def test_band_norms_take_the_whole_tensors_order(monkeypatch):
    """A band's norm sums in ATen's order for the whole tensor: the band graphs give each norm of a halo band
    the whole tensor's rows (`norm_rows`), and the plan for those rows is the whole tensor's, which differs
    from the band's own for Wan 2.2's 1024-channel norm at 720p on 2 ranks (10 blocks per output against 16;
    H200: 132 SMs, 2048 threads each)."""
    from rewrite.distributed.band_convs import ConvForms
    from rewrite.distributed.band_graphs import halo_first_decoder, whole_norm_orders
    from rewrite.distributed.band_ops import BandContext
    from rewrite.capture.wan import export_wan_steps
    from rewrite.models.wan import build_wan
    from rewrite.ops import aten_reduction
    from rewrite.pipeline import rewrite_graph

    monkeypatch.setattr(aten_reduction, "_device_limits", lambda index: (132, 2048))
    whole, band = (1, 1024, 2, 90, 160), (1, 1024, 2, 48, 160)  # band: 23 latent rows x 2, plus 2 halo rows
    strides = aten_reduction.dense_strides_in_order(whole, (5, 4, 3, 2, 1))
    assert strides == (29491200, 28800, 14400, 160, 1)
    assert aten_reduction.plan_of(whole, strides, 0, 4, 0).ctas == 10
    assert aten_reduction.plan_of(band, aten_reduction.dense_strides_in_order(band, strides), 0, 4, 0).ctas == 16

    decoder = build_wan("wan2.1", "tiny").decoder.to(torch.bfloat16)
    ctx = BandContext([(0, 3), (3, 5)], 0)
    traced, _ = halo_first_decoder(decoder, ctx, ConvForms(ctx.id))
    chunk0, _ = export_wan_steps(traced, torch.bfloat16, torch.device("cpu"), (1, 5, 6))
    rewrite_graph(chunk0, "lossless")
    assert whole_norm_orders(chunk0.graph_module, ctx) == 21  # every norm + SiLU that feeds a conv
    rows = sorted({n.kwargs["norm_rows"] for n in chunk0.graph_module.graph.nodes if "norm_rows" in n.kwargs})
    assert rows == [5, 10, 20, 40]  # the whole latent's 5 rows at each resolution


def test_band_graph_segments_replay_what_the_graphs_compute():
    """A band step graph cut at its collectives: one collective piece per halo exchange and gather, compute
    pieces between them; run eagerly, and captured as segments (`StandInSegments`: unwritten outputs are NaN)
    for chunk 0 and two steady steps, it gives the graph module's frames and caches bit for bit. The
    collectives talk to a stand-in of the other rank (fixed rows, the gather returns its input)."""
    import operator

    from rewrite.capture.wan import export_wan_steps
    from rewrite.distributed.band_convs import ConvForms
    from rewrite.distributed.band_graphs import halo_first_decoder
    from rewrite.distributed.band_ops import COLLECTIVES, BandContext
    from rewrite.distributed.band_segments import (Collective, Compute, SegmentedBandSteps, run_split,
                                                   split_at_collectives)
    from rewrite.distributed.bands import BandRun
    from rewrite.models.wan import build_wan
    from rewrite.pipeline import rewrite_graph
    from tests.op_cases import StandInNeighbour

    bf16 = torch.bfloat16
    decoder = build_wan("wan2.1", "tiny").decoder.to(bf16)
    ctx = BandContext([(0, 3), (3, 5)], 0)
    traced, _ = halo_first_decoder(decoder, ctx, ConvForms(ctx.id))
    chunk0, steady = export_wan_steps(traced, bf16, torch.device("cpu"), (1, 5, 6))
    for graph in (chunk0, steady):
        rewrite_graph(graph, "lossless")
    split = split_at_collectives(steady.graph_module)
    collectives = [n for n in steady.graph_module.graph.nodes if n.target in COLLECTIVES]
    # 24 halo exchanges (21 norms feeding a conv, 3 upsamplers) and the attention's gather
    assert [p.node for p in split.pieces if isinstance(p, Collective)] == collectives and len(collectives) == 25
    assert all(i.target is operator.getitem for p in split.pieces if isinstance(p, Collective) for i in p.items)

    ctx.run = BandRun(StandInNeighbour(), ctx.rows)  # rank 0 of 2
    try:
        g = torch.Generator().manual_seed(0)
        frames = [torch.randn((1, 4, 1, 5, 6), generator=g).to(bf16) for _ in range(3)]
        w0, w = chunk0.weights(decoder), steady.weights(decoder)
        with torch.no_grad():
            y, *caches = chunk0(w0, frames[0])
            assert all(torch.equal(a, b) for a, b in zip(run_split(split_at_collectives(chunk0.graph_module),
                                                                  chunk0.bind(w0, frames[0])), [y, *caches]))
            backend = StandInSegments()
            segments = SegmentedBandSteps(chunk0, steady, w0, w, frames[0], backend)
            computes = sum(isinstance(p, Compute) for gm in (chunk0.graph_module, steady.graph_module)
                           for p in split_at_collectives(gm).pieces)
            assert backend.captures == computes == 2 * 26  # each graph: a compute piece around every collective
            assert torch.equal(segments.first(frames[0]), y)
            for frame in frames[1:]:
                y, *caches = steady(w, frame, *caches)
                assert torch.equal(segments.next(frame), y)
                assert all(torch.equal(a, b) for a, b in zip(segments.caches, caches))
    finally:
        ctx.run = None


def test_optimize_group_errors_copies_and_pickles_in_process():
    """No process group here: a bad `group=`/`output=` raises before the installed runner changes; the
    installed `vae.decode` (set directly, with a stand-in group) survives a deepcopy sharing its group, and
    a pickle refuses it with the remedy."""
    import copy
    import pickle

    from rewrite import optimize
    from rewrite.distributed.sharding import Sharding, installed_sharding, set_sharding
    from rewrite.models.wan import build_wan

    vae = optimize(build_wan("wan2.1", "tiny"), "lossless")
    runner = vae.__dict__["_rewrite_runner"]
    with pytest.raises(TypeError, match="group= must be a torch.distributed ProcessGroup or a 1-D DeviceMesh"):
        optimize(vae, "channels_last", group="world")
    from rewrite.distributed import decode_sharded

    with pytest.raises(ValueError, match="cuda_graphs must be one of segments, whole, off; got 'on'"):
        decode_sharded(vae, torch.zeros(1, 4, 1, 4, 4), cuda_graphs="on")
    with pytest.raises(ValueError, match="output='band' is for a sharded decode; it needs group="):
        optimize(vae, "channels_last", output="band")
    assert vae.__dict__["_rewrite_runner"] is runner and "decode" not in vae.__dict__
    sharding = Sharding(object(), "all")
    set_sharding(vae, sharding)
    twin = copy.deepcopy(vae)
    assert installed_sharding(twin) is sharding and twin.decode.args[0] is twin
    with pytest.raises(TypeError, match=r"cannot be pickled .* without group= first"):
        pickle.dumps(vae)
    optimize(vae, "lossless")
    assert installed_sharding(vae) is None and "decode" not in vae.__dict__
    assert vae.__dict__["_rewrite_runner"] is runner  # the same configuration: the runner is kept


# ---- spawned ranks ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _latents(vae, batch, frames, height, width, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn((batch, vae.config.z_dim, frames, height, width), generator=g).to(dtype)


def _vae(version, dtype):
    from rewrite.models.wan import build_wan

    return build_wan(version, "tiny").to(dtype)


def _decode_case(version, dtype, batch, frames, height, width, output="all", tiling=False, slicing=False,
                 optimized=False):
    def case(rank, world):
        from rewrite import optimize
        from rewrite.distributed import decode_sharded

        vae = _vae(version, dtype)
        reference = _vae(version, dtype)
        for v in (vae, reference):
            if tiling:
                r = v.spatial_compression_ratio
                v.enable_tiling(tile_sample_min_height=4 * r, tile_sample_min_width=4 * r,
                                tile_sample_stride_height=3 * r, tile_sample_stride_width=3 * r)
            if slicing:
                v.enable_slicing()
        if optimized:
            optimize(vae, "lossless")  # captures nothing until its own decode: the sharded decode uses a copy
        before = {name for name, m in vae.named_modules() if m.__dict__.get("forward") is not None}
        z = _latents(vae, batch, frames, height, width, dtype, seed=frames * 10 + batch)
        with torch.no_grad():
            video, info = decode_sharded(vae, z, output=output, return_info=True)
            expected = reference.decode(z).sample
        after = {name for name, m in vae.named_modules() if m.__dict__.get("forward") is not None}
        if output == "all" or (output == "rank0" and rank == 0):
            equal = video is not None and video.shape == expected.shape and torch.equal(video, expected)
        elif output == "rank0":
            equal = video is None
        else:
            a, b = info.output_rows[rank]
            equal = video.shape[-2] == b - a and torch.equal(video, expected[..., a:b, :])
        return {"equal": bool(equal), "mode": info.mode, "reason": info.reason, "local": info.band_local_ops,
                "gathered": info.gathered_ops, "gathered_reasons": info.gathered_reasons, "tiles": info.tiles,
                "module_unchanged": before == after}
    return case


class StandInSegments:
    """CUDA-graph semantics for the band graph segments on the CPU: a capture runs nothing into its static
    outputs (filled with NaN, as a capture leaves them unwritten); a replay runs the segment on the inputs it
    was captured with and copies into those outputs. So a value read from a wrong buffer shows."""

    def __init__(self):
        self.captures = 0

    def can_capture(self, device):
        return True

    def new_pool(self):
        return None

    def capture(self, fn, inputs, pool):
        self.captures += 1
        outputs = [o.clone().fill_(float("nan")) if o.is_floating_point() else o.clone() for o in fn(*inputs)]

        def replay():
            for static, value in zip(outputs, fn(*inputs)):
                static.copy_(value)
        return replay, outputs


def gloo_cuda_segments():
    """The production capture of the band graphs (`CudaSegments`) claiming it can capture on the CPU: for the
    refusal of cuda_graphs="whole" over gloo, which comes before any capture."""
    from rewrite.distributed.band_segments import CudaSegments

    class GlooCudaSegments(CudaSegments):
        can_capture = staticmethod(lambda device: True)
    return GlooCudaSegments()


def _forced_conv_check(rank):
    """A conv check that fails chosen calls as a cuDNN kernel chosen from the band's shape would: on rank 0
    the calls of one residual block's conv1, on rank 1 every resampler's, so the ranks must take the union."""
    from rewrite.distributed.band_convs import RESAMPLE_HALO, check_call

    def check(call, *args):
        if (call.module == "decoder.up_blocks.1.resnets.0.conv1") if rank == 0 else call.kind == RESAMPLE_HALO:
            return False, f"{call.describe()}: failed by the test"
        return check_call(call, *args)
    return check


def _graph_case(version, batch, frames, height, width, refuse=False, segments=None, cuda_graphs="segments",
                gather=False):
    """An optimized module's sharded decode through the band graphs (bf16: on this CPU fp32's SiLU depends on
    an element's position, so fp32 band graphs are refused): the first call checks chunk 0 and two steady
    steps against the eager band mode, the second serves from the graphs alone, a third after a weight edit
    (in place, on this module and the reference alike) still from the graphs and equal. `refuse`: rank 1's
    steady graph is made to add 1 to its output, so every rank refuses the pair at step 1 and the eager band
    mode finishes the decode. `segments` (a capture factory: `StandInSegments` or `gloo_cuda_segments`): the band
    graphs captured as `cuda_graphs` says: checked against the band graphs on the second call, replayed alone
    on the third (after the in-place edit), captured and checked again on a fourth after a weight was
    replaced by a new tensor. `gather`: the conv checks fail chosen calls (`_forced_conv_check`), so their
    convs run gathered, the same on every rank."""
    def case(rank, world):
        from rewrite import optimize, report
        from rewrite.distributed import decode_sharded
        from rewrite.distributed.band_graphs import store_of
        from rewrite.runtime.runner import installed_runner

        bf16 = torch.bfloat16
        vae, reference = optimize(_vae(version, bf16), "lossless"), _vae(version, bf16)
        backend = segments() if segments is not None else None
        if backend is not None:
            store_of(installed_runner(vae)).segment_backend = backend
        if gather:
            store_of(installed_runner(vae)).conv_check = _forced_conv_check(rank)
        if refuse and rank == 1:
            runner = installed_runner(vae)
            rewrite_graph = runner.rewrite_graph

            def broken(graph, level):
                rewrite_graph(graph, level)
                if graph.name == "steady":
                    g = graph.graph_module.graph
                    output = next(n for n in g.nodes if n.op == "output")
                    y = output.args[0][0]
                    with g.inserting_before(output):
                        wrong = g.call_function(torch.ops.aten.add.Tensor, (y, 1.0))
                    output.args = ((wrong, *output.args[0][1:]),)
                    graph.graph_module.recompile()

            runner.rewrite_graph = broken
        z = _latents(vae, batch, frames, height, width, bf16, seed=frames)
        calls = []
        with torch.no_grad():
            expected = reference.decode(z).sample
            for edit in (None, None, "in place") + (("replaced",) if segments is not None else ()):
                for v in (vae, reference) if edit else ():
                    conv = v.decoder.up_blocks[0].resnets[0].conv1
                    if edit == "in place":
                        conv.weight.mul_(1.25)
                    else:
                        conv.weight = torch.nn.Parameter(conv.weight * 0.5)
                if edit:
                    expected = reference.decode(z).sample
                video, info = decode_sharded(vae, z, return_info=True, cuda_graphs=cuda_graphs)
                calls.append({"equal": bool(torch.equal(video, expected)), "mode": info.mode,
                              "steps": info.graph_steps, "checks": info.graph_checks, "reason": info.graph_reason,
                              "replays": info.graph_replays, "gathered convs": info.graph_gathered_convs})
        first = calls[0]
        return {"equal": all(c["equal"] for c in calls), "mode": first["mode"], "reason": None,
                "local": 1, "gathered": 0, "gathered_reasons": [], "tiles": None, "module_unchanged": True,
                "calls": calls, "captures": getattr(backend, "captures", None), "report": str(report(vae))}
    return case


def _one_frame_clips_case(rank, world):
    """1-frame clips (an image): the first checks chunk 0 against the eager band mode, the second runs the
    graphs alone (no eager op: chunk 0 is checked, no steady step to check), a 3-frame clip then checks its
    two steady steps. Each `torch.equal` to the single-process decode."""
    from rewrite import optimize
    from rewrite.distributed import decode_sharded

    bf16 = torch.bfloat16
    vae, reference = optimize(_vae("wan2.1", bf16), "lossless"), _vae("wan2.1", bf16)
    seen = []
    with torch.no_grad():
        for frames in (1, 1, 3):
            z = _latents(vae, 1, frames, 4, 4, bf16, seed=frames)
            video, info = decode_sharded(vae, z, return_info=True)
            seen.append((bool(torch.equal(video, reference.decode(z).sample)), info.graph_steps, info.graph_checks,
                         info.band_local_ops > 0))
    return seen


def _check_graphs(results, world, frames):
    """Each band-graph case served from its graphs as `_graph_case` says (or refused them on every rank)."""
    problems = []
    for name in results[0]:
        if "band graph" not in name or name.endswith(("failure", "1-frame clips")):
            continue
        for rank in range(world):
            status, value = results[rank][name]
            if status != "ok":
                continue  # reported by _check_decodes
            calls, n = value["calls"], frames.get(name)
            if "refused" in name:
                why = "the band graphs differ from the eager band mode at step 1 (steady) on some rank"
                expected = [(2, 2, why, 0)] + [(0, 0, why, 0)] * 2
            elif "on gloo" in name:
                why = "gloo collectives cannot run inside a CUDA graph (cuda_graphs='whole' needs NCCL)"
                expected = [(n, 3, None, 0)] + [(n, 0, why, 0)] * 3
            elif "captures off" in name:
                expected = [(n, 3, None, 0)] + [(n, 0, None, 0)] * 3
            elif "segments" in name or "whole steps" in name:
                expected = [(n, 3, None, 0), (n, 3, None, n), (n, 0, None, n), (n, 3, None, n)]
                if "whole steps" in name and value["captures"] != 4:  # one graph per step, captured twice
                    problems.append(f"{name}, rank {rank}: {value['captures']} captures, expected 4")
            else:
                expected = [(n, 3, None, 0), (n, 0, None, 0), (n, 0, None, 0)]
            seen = [(c["steps"], c["checks"], c["reason"], c["replays"]) for c in calls]
            state = ("graphs refused" if "refused" in name else
                     "captured steps segments: serving" if "segments" in name else
                     "captured steps whole: serving" if name.startswith("wan2.1 band graph whole steps b1") else
                     "graphs serving, 8 of 56 conv calls gathered" if "gathered convs" in name else
                     "graphs serving, 0 of ")
            if f"rank {rank} of {world}, latent rows" not in value["report"] or state not in value["report"]:
                problems.append(f"{name}, rank {rank}: the report does not say {state!r}: {value['report']}")
            if seen != expected:
                problems.append(f"{name}, rank {rank}: (graph steps, checks, reason, replays) per call {seen}, "
                                f"expected {expected}")
            gathered = [c["gathered convs"] for c in calls if c["steps"]]
            if gathered != [8 if "gathered convs" in name else 0] * len(gathered):
                problems.append(f"{name}, rank {rank}: gathered conv calls per call {gathered}")
    return problems


def _mesh_case(rank, world):
    """`group=` a 1-D DeviceMesh (its own process group: its own verdicts)."""
    from torch.distributed.device_mesh import init_device_mesh

    from rewrite.distributed import decode_sharded

    mesh = init_device_mesh("cpu", (world,))
    vae = _vae("wan2.1", torch.bfloat16)
    z = _latents(vae, 1, 2, 4, 4, torch.bfloat16)
    with torch.no_grad():
        video, info = decode_sharded(vae, z, group=mesh, return_info=True)
        expected = vae.decode(z).sample
    return {"equal": bool(torch.equal(video, expected)), "mode": info.mode, "reason": info.reason,
            "local": info.band_local_ops, "gathered": info.gathered_ops, "gathered_reasons": [], "tiles": None,
            "module_unchanged": True}


def _mismatch_case(what):
    def case(rank, world):
        from rewrite.distributed import ShardMismatchError, decode_sharded

        vae = _vae("wan2.1", torch.float32)
        z = _latents(vae, 1, 1, 4, 4, torch.float32)
        if rank == 1 and what == "latents":
            z[0, 0, 0, 0, 0] += 1e-3
        if rank == 1 and what == "shape":
            z = _latents(vae, 1, 1, 4, 5, torch.float32)
        if rank == 1 and what == "weights":
            with torch.no_grad():
                vae.decoder.up_blocks[1].resnets[0].conv2.weight.view(-1)[7] += 1e-3
        try:
            with torch.no_grad():
                decode_sharded(vae, z)
        except ShardMismatchError as error:
            return {"raised": str(error)}
        return {"raised": None}
    return case


def _fail_on_rank1(owner, name: str, call: int, message: str) -> None:
    """Make `owner.name` (a function or method) raise RuntimeError(message) on its `call`-th call, on rank 1."""
    original, calls = getattr(owner, name), [0]

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise RuntimeError(message)
        return original(*args, **kwargs)
    setattr(owner, name, failing)


def _failing_decode(rank, vae, z) -> dict:
    """`decode_sharded(vae, z, timeout=3)`: what it raised (type, message) and after how many seconds. The
    failing rank (1) outlives the others' 3 s waits (so they fail by the timeout, not by its exit); the others
    stay a moment: rank 0 hosts the store that the others read."""
    from rewrite.distributed import PeerFailedError, decode_sharded

    start = time.monotonic()
    try:
        with torch.no_grad():
            decode_sharded(vae, z, timeout=3)
        outcome = {"type": None, "message": ""}
    except Exception as error:  # noqa: BLE001
        outcome = {"type": "PeerFailedError" if isinstance(error, PeerFailedError) else type(error).__name__,
                   "message": str(error)}
    outcome["seconds"] = time.monotonic() - start
    time.sleep(6 if rank == 1 else 1.5)
    return outcome


def _failure_case(rank, world):
    """Rank 1 raises in the middle of the decode (its third norm) and stays alive; the others must fail
    with its error within the per-wait timeout, not hang."""
    from rewrite.distributed import bands

    vae = _vae("wan2.1", torch.float32)
    z = _latents(vae, 1, 2, 6, 4, torch.float32)
    if rank == 1:
        _fail_on_rank1(bands, "band_norm", 3, "injected failure on rank 1")
    return _failing_decode(rank, vae, z)


def _graph_failure_case(rank, world):
    """Rank 1 raises inside a band graph (its fourth halo exchange of a call the verified graphs serve alone)
    and stays alive; rank 0, waiting in that exchange, must fail with its error within the per-wait timeout."""
    from rewrite import optimize
    from rewrite.distributed import decode_sharded
    from rewrite.distributed.comm import Comm

    bf16 = torch.bfloat16
    vae = optimize(_vae("wan2.1", bf16), "lossless")
    z = _latents(vae, 1, 3, 4, 4, bf16)
    with torch.no_grad():
        _, info = decode_sharded(vae, z, timeout=3, return_info=True)  # the pair checked: later calls use it alone
    if rank == 1:
        _fail_on_rank1(Comm, "exchange_edges", 4, "injected failure in a band graph on rank 1")
    return {**_failing_decode(rank, vae, z), "checked": info.graph_checks}


def _optimize_case(version, reference_level):
    """`optimize(vae, "lossless", group=...)`: a plain `vae.decode` is the sharded decode (outputs "all" and
    "band"; the runner's `last_path` stays "none" while only the band mode, on a copy of the decoder, ran);
    a call that decode_sharded decodes single-process (autograd on) goes through the class decode and the
    runner; bad groups raise and change nothing; optimizing without group= restores the class decode.
    The reference is the single-process decode at `reference_level`: "lossless" captures its graphs (~8 s
    on 2 cores), "off" (diffusers, which lossless equals) captures nothing."""
    def case(rank, world):
        import copy

        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        from rewrite import optimize, report
        from rewrite.distributed import output_rows
        from rewrite.distributed.sharding import installed_sharding
        from rewrite.models.auk import AuKConfig, AuKVAE
        from rewrite.reporting import FallbackLog

        f32, group = torch.float32, dist.group.WORLD
        reference = optimize(_vae(version, f32), reference_level)
        z = _latents(reference, 1, 2, 5, 4, f32, seed=3)  # one latent size: a new one costs the runner seconds
        seen = {}
        with torch.no_grad():
            expected = reference.decode(z).sample
            vae = copy.deepcopy(reference)  # with its captured graphs: one capture per case at most
            if "_rewrite_runner" in vae.__dict__:
                vae.__dict__["_rewrite_runner"].fallbacks = FallbackLog()  # last_path "none" until the runner runs
            tensors = dict(vae.state_dict(keep_vars=True))
            optimize(vae, "lossless", group=group)
            seen["all"] = torch.equal(vae.decode(z).sample, expected)
            seen["bands ran"] = report(vae).last_path == "none"
            optimize(vae, "lossless", group=group, output="band")
            a, b = output_rows(vae, z.shape[3], world)[rank]
            (band,) = vae.decode(z, return_dict=False)
            seen["band"] = band.shape[-2] == b - a and torch.equal(band, expected[..., a:b, :])
            with torch.enable_grad():  # a guard: single-process, through the class decode and the runner
                seen["single-process"] = torch.equal(vae.decode(z).sample, expected[..., a:b, :])
            seen["through the runner"] = report(vae).last_path == "reference"  # its autograd guard
            errors = {}
            mesh = DeviceMesh("cpu", torch.arange(world).reshape(1, world), _init_backend=False)
            for name, call in (("string", lambda: optimize(vae, "lossless", group="world")),
                               ("2-D mesh", lambda: optimize(vae, "lossless", group=mesh)),
                               ("output", lambda: optimize(vae, "lossless", group=group, output="rows")),
                               ("off", lambda: optimize(vae, "off", group=group)),
                               ("auk", lambda: optimize(AuKVAE(AuKConfig.tiny()), "lossless", group=group))):
                try:
                    call()
                    errors[name] = "no error"
                except (TypeError, ValueError) as error:
                    errors[name] = f"{type(error).__name__}: {error}"
            seen["errors"] = errors
            seen["unchanged by the errors"] = installed_sharding(vae).output == "band"
            optimize(vae, "lossless")
            with torch.set_grad_enabled(reference_level == "off"):  # no graphs captured: the reference path
                seen["plain"] = ("decode" not in vae.__dict__ and vae.decode.__func__ is type(vae).decode
                                 and torch.equal(vae.decode(z).sample, expected))
        seen["same tensors"] = all(t is tensors[k] for k, t in vae.state_dict(keep_vars=True).items())
        return seen
    return case


def _gpu_case(version, height, width, frames):
    """Full-size decoder on CUDA (every rank on cuda:0 over gloo): the sharded decode, eager band mode and
    then band graphs (the module optimized: checked, then their CUDA-graph segments checked, then replayed
    alone), against this process's single-process decode and the `lossless` one; what ran on the band, what
    was gathered, and whether the segments served."""
    def case(rank, world):
        from rewrite import optimize
        from rewrite.distributed import decode_sharded
        from rewrite.models.wan import build_wan

        torch.cuda.set_device(0)
        vae = build_wan(version, "full").to("cuda", torch.bfloat16).requires_grad_(False)
        z = _latents(vae, 1, frames, height, width, torch.bfloat16).cuda()
        with torch.no_grad():
            start = time.perf_counter()
            video, info = decode_sharded(vae, z, output="rank0", return_info=True)  # eager band mode
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            again = decode_sharded(vae, z, output="rank0")  # verdicts cached: no check runs
            expected = vae.decode(z).sample if rank == 0 else None
            # now the band graphs: checked against the eager band mode on the first call, their CUDA-graph
            # segments captured and checked against them on the second, replayed alone on the third
            optimize(vae, "lossless")
            videos, infos, graph_seconds = [], [], []
            for _ in range(3):
                torch.cuda.synchronize()
                start = time.perf_counter()
                out, call_info = decode_sharded(vae, z, output="rank0", return_info=True)
                torch.cuda.synchronize()
                graph_seconds.append(time.perf_counter() - start)
                videos.append(out)
                infos.append(call_info)
            result = {"mode": info.mode, "reason": info.reason, "local": info.band_local_ops, "seconds": seconds,
                      "gathered": info.gathered_ops, "gathered_reasons": info.gathered_reasons, "tiles": None,
                      "checks": info.checks_run, "module_unchanged": True,
                      "graph calls": [(i.graph_steps, i.graph_replays, i.graph_checks, i.graph_reason) for i in infos],
                      "gathered convs": [i.graph_gathered_convs for i in infos],
                      "graph seconds": graph_seconds}
            served = (infos[2].graph_steps, infos[2].graph_replays, infos[2].graph_checks) == (frames, frames, 0)
            if rank == 0:
                lossless = vae.decode(z).sample
                result["equal"] = all(torch.equal(v, expected) for v in (video, again, *videos))
                result["equal_lossless"] = bool(torch.equal(video, lossless)) and served
            else:
                result["equal"] = all(v is None for v in (video, again, *videos))
                result["equal_lossless"] = served
        return result
    return case


def _cases(name):
    f32, bf16 = torch.float32, torch.bfloat16
    if name.startswith("gpu "):
        _, version, size, frames = name.split()
        height, width = (int(v) for v in size.split("x"))
        return {f"{name} rank0": _gpu_case(version, height, width, int(frames))}
    if name == "two":
        return {
            "wan2.1 fp32 b1 f5 5x6 all": _decode_case("wan2.1", f32, 1, 5, 5, 6),
            "wan2.1 fp32 b1 f1 5x6 band": _decode_case("wan2.1", f32, 1, 1, 5, 6, output="band"),
            "wan2.1 fp32 b1 f1 5x6 rank0": _decode_case("wan2.1", f32, 1, 1, 5, 6, output="rank0"),
            "wan2.1 bf16 b2 f5 4x4 all": _decode_case("wan2.1", bf16, 2, 5, 4, 4),
            "wan2.2 bf16 b2 f1 5x6 all": _decode_case("wan2.2", bf16, 2, 1, 5, 6),
            "wan2.2 fp32 b1 f5 5x4 all": _decode_case("wan2.2", f32, 1, 5, 5, 4),
            "wan2.2 fp32 b1 f1 4x6 band": _decode_case("wan2.2", f32, 1, 1, 4, 6, output="band"),
            "wan2.1 slicing b2 f2 4x4": _decode_case("wan2.1", f32, 2, 2, 4, 4, slicing=True),
            "wan2.1 optimized module f2 4x4": _decode_case("wan2.1", f32, 1, 2, 4, 4, optimized=True),
            "wan2.1 band graphs b1 f4 5x6": _graph_case("wan2.1", 1, 4, 5, 6),
            "wan2.2 band graphs b1 f3 5x6": _graph_case("wan2.2", 1, 3, 5, 6),
            "wan2.1 band graphs refused b1 f3 4x4": _graph_case("wan2.1", 1, 3, 4, 4, refuse=True),
            "wan2.1 band graphs gathered convs b1 f3 5x6": _graph_case("wan2.1", 1, 3, 5, 6, gather=True),
            "wan2.2 band graph segments b1 f3 5x6": _graph_case("wan2.2", 1, 3, 5, 6, segments=StandInSegments),
            "wan2.1 band graph whole steps b1 f3 4x4": _graph_case("wan2.1", 1, 3, 4, 4, segments=StandInSegments,
                                                                   cuda_graphs="whole"),
            "wan2.1 band graph captures off b1 f3 4x4": _graph_case("wan2.1", 1, 3, 4, 4, segments=StandInSegments,
                                                                    cuda_graphs="off"),
            "wan2.1 band graph whole steps on gloo b1 f3 4x4": _graph_case("wan2.1", 1, 3, 4, 4,
                                                                           segments=gloo_cuda_segments,
                                                                           cuda_graphs="whole"),
            "wan2.1 bf16 f2 4x4 on a DeviceMesh": _mesh_case,
            "wan2.1 3 rows, 2 ranks: single-process": _decode_case("wan2.1", f32, 1, 2, 3, 4),
            "wan2.1 tiled f2 7x8": _decode_case("wan2.1", f32, 1, 2, 7, 8, tiling=True),
            "wan2.2 tiled f2 7x8 rank0": _decode_case("wan2.2", f32, 1, 2, 7, 8, tiling=True, output="rank0"),
            "optimize group= wan2.1": _optimize_case("wan2.1", "lossless"),
            "optimize group= wan2.2": _optimize_case("wan2.2", "off"),
            "mismatch latents": _mismatch_case("latents"),
            "mismatch weights": _mismatch_case("weights"),
            "mismatch shape": _mismatch_case("shape"),
            "band graphs of 1-frame clips": _one_frame_clips_case,
            "band graph failure": _graph_failure_case,  # last: it leaves the group with unfinished operations
        }
    return {
        "wan2.1 bf16 b2 f5 7x6 all": _decode_case("wan2.1", bf16, 2, 5, 7, 6),
        "wan2.2 fp32 b1 f1 6x4 band": _decode_case("wan2.2", f32, 1, 1, 6, 4, output="band"),
        "wan2.2 bf16 b1 f5 7x4 all": _decode_case("wan2.2", bf16, 1, 5, 7, 4),
        "wan2.1 tiled f1 7x8": _decode_case("wan2.1", f32, 1, 1, 7, 8, tiling=True),
        "wan2.1 band graph segments b1 f3 7x6": _graph_case("wan2.1", 1, 3, 7, 6, segments=StandInSegments),
        "failure": _failure_case,  # last: it leaves the group with unfinished operations
    }


def _worker(rank, world, port, name, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))  # a rank starved by a loaded machine may wait long
    results = {}
    for case_name, case in _cases(name).items():
        try:
            results[case_name] = ("ok", case(rank, world))
        except Exception as error:  # noqa: BLE001 - reported by the test
            results[case_name] = ("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    os._exit(0)  # the failure case leaves pending operations: no destroy_process_group


def _spawn(world, name, tmp_path, limit=SPAWN_LIMIT_S):
    context = mp.start_processes(_worker, args=(world, _free_port(), name, str(tmp_path)), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + limit
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"the {world} ranks did not finish within {limit} s (a hang)")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def _check_decodes(results, world):
    problems = []
    for name in results[0]:
        if name.startswith(("mismatch", "optimize")) or name.endswith(("failure", "1-frame clips")):
            continue
        for rank in range(world):
            status, value = results[rank][name]
            if status != "ok":
                problems.append(f"{name}, rank {rank}: {value}")
                continue
            if not value["equal"] or not value["module_unchanged"]:
                problems.append(f"{name}, rank {rank}: {value}")
            expected = ("single-process" if "single-process" in name else "tiles" if "tiled" in name
                        else "bands")
            if value["mode"] != expected:
                problems.append(f"{name}, rank {rank}: mode {value['mode']} ({value['reason']}), expected {expected}")
            if expected == "bands" and value["local"] == 0:
                problems.append(f"{name}, rank {rank}: no op ran band-locally")
    return problems


@pytest.mark.slow  # ~90-270 s: two spawned ranks through ~20 full decodes
def test_two_ranks(tmp_path):
    results = _spawn(2, "two", tmp_path)
    problems = _check_decodes(results, 2)
    tiles = [results[r]["wan2.1 tiled f2 7x8"][1]["tiles"] for r in range(2)]
    assert tiles == [[(0, 0), (0, 6), (3, 3), (6, 0), (6, 6)], [(0, 3), (3, 0), (3, 6), (6, 3)]], tiles
    for rank in range(2):
        messages = {k: results[rank][k] for k in ("mismatch latents", "mismatch weights", "mismatch shape")}
        for key, needle in (("mismatch latents", "the latents (rank 0 differs from rank 1)"),
                            ("mismatch weights", "decoder.up_blocks.1.resnets.0.conv2.weight"),
                            ("mismatch shape", "the latent shape (rank 0: (1, 4, 1, 4, 4), rank 1: (1, 4, 1, 4, 5))")):
            status, value = messages[key]
            if status != "ok" or not value["raised"] or needle not in value["raised"]:
                problems.append(f"{key}, rank {rank}: expected a ShardMismatchError naming {needle!r}; got {value}")
    problems += _check_optimize(results, 2)
    problems += _check_graphs(results, 2, {"wan2.1 band graphs b1 f4 5x6": 4, "wan2.2 band graphs b1 f3 5x6": 3,
                                           "wan2.1 band graphs gathered convs b1 f3 5x6": 3,
                                           "wan2.2 band graph segments b1 f3 5x6": 3,
                                           "wan2.1 band graph whole steps b1 f3 4x4": 3,
                                           "wan2.1 band graph captures off b1 f3 4x4": 3,
                                           "wan2.1 band graph whole steps on gloo b1 f3 4x4": 3})
    for rank in range(2):
        status, value = results[rank]["band graphs of 1-frame clips"]
        # (equal, graph steps, checks, eager band ops ran) per call
        if status != "ok" or value != [(True, 1, 1, True), (True, 1, 0, False), (True, 3, 2, True)]:
            problems.append(f"band graphs of 1-frame clips, rank {rank}: {status} {value}")
        status, value = results[rank]["band graph failure"]
        if rank == 1:
            expected = status == "ok" and value["type"] == "RuntimeError" and "injected failure" in value["message"]
        else:
            expected = (status == "ok" and value["type"] == "PeerFailedError" and 2.5 < value["seconds"] < 10
                        and "rank 1 failed: RuntimeError: injected failure in a band graph" in value["message"])
        if not expected or (status == "ok" and value["checked"] != 3):
            problems.append(f"band graph failure, rank {rank}: {status} {value}")
    assert not problems, "\n".join(problems)


#: what `optimize` says for each bad call of `_optimize_case`
OPTIMIZE_ERRORS = {
    "string": "TypeError: optimize: group= must be a torch.distributed ProcessGroup or a 1-D DeviceMesh; got str",
    "2-D mesh": "ValueError: optimize: group= takes a 1-D DeviceMesh; got one of 2 dimensions (1, 2)",
    "output": "ValueError: optimize: output must be one of 'all', 'rank0', 'band'; got 'rows'",
    "off": "ValueError: optimize: level 'off' leaves the module as diffusers made it",
    "auk": "TypeError: optimize: group= is for the Wan VAE (diffusers AutoencoderKLWan); got AuKVAE",
}


def _check_optimize(results, world):
    problems = []
    for version in ("wan2.1", "wan2.2"):
        for rank in range(world):
            status, seen = results[rank][f"optimize group= {version}"]
            if status != "ok":
                problems.append(f"optimize group= {version}, rank {rank}: {seen}")
                continue
            errors = seen.pop("errors")
            if not all(seen.values()):
                problems.append(f"optimize group= {version}, rank {rank}: {seen}")
            for name, needle in OPTIMIZE_ERRORS.items():
                if not errors[name].startswith(needle):
                    problems.append(f"optimize group= {version}, rank {rank}, {name}: {errors[name]!r}")
    return problems


@pytest.mark.slow  # three spawned ranks
def test_three_ranks_and_a_failing_rank(tmp_path):
    results = _spawn(3, "three", tmp_path)
    problems = _check_decodes(results, 3)
    problems += _check_graphs(results, 3, {"wan2.1 band graph segments b1 f3 7x6": 3})
    for rank in range(3):
        status, value = results[rank]["failure"]
        assert status == "ok", value
        if rank == 1:
            assert value["type"] == "RuntimeError" and "injected failure on rank 1" in value["message"], value
        else:
            assert value["type"] == "PeerFailedError", value
            assert "rank 1 failed: RuntimeError: injected failure on rank 1" in value["message"], value
            assert 2.5 < value["seconds"] < 60, value  # the 3 s wait timeout (plus a loaded machine's delays), not the 300 s hang
    assert not problems, "\n".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("version, size", [("wan2.1", "60x104"), ("wan2.1", "90x160"), ("wan2.2", "30x52"),
                                           ("wan2.2", "45x80")], ids=("wan2.1-480p", "wan2.1-720p",
                                                                      "wan2.2-480p", "wan2.2-720p"))
def test_gpu_two_gloo_ranks_on_one_device(tmp_path, version, size):
    """Two ranks on cuda:0 over gloo (CUDA tensors staged through host memory): full-size bf16 decoders,
    3 latent frames (chunk 0 and two steady steps), `torch.equal` to the single-process decode and to
    `lossless`; prints what ran on the band, what was gathered and why."""
    name = f"gpu {version} {size} 3"
    results = _spawn(2, name, tmp_path, limit=600)
    problems = _check_decodes(results, 2)
    for rank in range(2):
        status, value = results[rank][f"{name} rank0"]
        print(f"rank {rank}:", value)
        if status == "ok" and not value["equal_lossless"]:
            problems.append(f"rank {rank}: the sharded decode differs from lossless, or the band graph segments did "
                            f"not serve the third call: {value['graph calls']}")
    assert not problems, "\n".join(problems)
