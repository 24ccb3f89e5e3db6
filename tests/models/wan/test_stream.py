"""Streamed Wan decodes: `vae.decode_stream(z)` and `rewrite.stream` sessions give, piece by piece, what one
`vae.decode` gives (torch.equal), whatever else uses the VAE between their calls.

CPU tests run the graphs eagerly, and with `tests.graph_fakes.FakeGraphs` standing in for CUDA-graph capture
(shared static caches, outputs overwritten by the next replay) so that the ownership of those caches is
exercised here; the `gpu`-marked tests run the real CUDA graphs.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import rewrite
from rewrite import optimize, report
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import build_wan
from rewrite.reporting import FallbackLog
from rewrite.models.wan import stream as stream_module
from rewrite.runtime.graphs import CudaGraphBackend
from rewrite.runtime.runner import installed_runner
from rewrite.models.wan.stream import ClipState, StreamSession, frame_local_post_quant_conv
from tests import quick
from tests.conftest import WanPair
from tests.graph_fakes import FakeGraphs
from tests.threads import run_threads

VERSIONS = ("wan2.1", "wan2.2")
CHUNKINGS = ((1,), (5,), (1, 1, 1, 1, 1), (2, 3), (1, 2, 2), (3, 1, 1))


def chunks_of(z: torch.Tensor, sizes) -> list[torch.Tensor]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [z[:, :, s : s + n] for s, n in zip(starts, sizes)]


def push_all(session: StreamSession, z: torch.Tensor, sizes) -> torch.Tensor:
    return torch.cat([session.push(c) for c in chunks_of(z, sizes)], 2)


@pytest.fixture
def static_steps(wan_pair):
    """`static_steps(version)`: the pair's optimized VAE running `CudaGraphSteps` with `FakeGraphs` (undone after)."""
    touched = []

    def get(version):
        pair = wan_pair(version)
        runner = installed_runner(pair.optimized)
        runner.graph_backend = FakeGraphs()
        runner.cuda_graphs.clear()
        touched.append(runner)
        return pair

    yield get
    for runner in touched:
        runner.graph_backend = CudaGraphBackend()
        runner.cuda_graphs.clear()


@pytest.fixture
def saves(monkeypatch):
    """How many times a paused clip was handed a copy of the static caches."""
    count = [0]
    original = ClipState.save

    def counted(self, caches):
        count[0] += 1
        return original(self, caches)

    monkeypatch.setattr(ClipState, "save", counted)
    return count


# ------------------------------------------------------------------------------------------ decode_stream


@torch.no_grad()
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("batch", (1, 2))
@pytest.mark.parametrize("frames", (1, 5))
def test_decode_stream_pieces_are_the_decode_frame_by_frame(wan_pair, version, batch, frames):
    pair = wan_pair(version)
    z = pair.latents(batch, frames, seed=frames + 10 * batch)
    expected = pair.reference.decode(z).sample
    pieces = list(pair.optimized.decode_stream(z))
    assert [(start, piece.shape[2]) for start, piece in pieces] == [(0, 1)] + [(1 + 4 * i, 4) for i in range(frames - 1)]
    assert torch.equal(torch.cat([piece for _, piece in pieces], 2), expected)
    assert report(pair.optimized).last_path == "graphs" and report(pair.optimized).last_detail == "streamed"


@torch.no_grad()
@pytest.mark.parametrize("version", VERSIONS)
def test_decode_stream_with_the_cuda_graph_steps_and_decodes_between_pieces(static_steps, version, saves):
    pair = static_steps(version)
    z, other = pair.latents(2, 5, seed=1), pair.latents(2, 3, seed=2)
    expected, expected_other = pair.reference.decode(z).sample, pair.reference.decode(other).sample
    pieces = []
    for i, (_, piece) in enumerate(pair.optimized.decode_stream(z)):
        pieces.append(piece)
        if i in (1, 3):  # a plain decode of the same shape takes the static caches between two pieces
            assert torch.equal(pair.optimized.decode(other).sample, expected_other)
    assert torch.equal(torch.cat(pieces, 2), expected)
    assert saves[0] == 2 and len(installed_runner(pair.optimized).cuda_graphs) == 1  # one shared shape


@torch.no_grad()
def test_a_fresh_module_streams_a_sliced_batch_from_the_slices_graphs():
    """With `enable_slicing()` the decoder runs batch-1 slices, so the guards must check (and capture) the
    slices' graphs, not the whole batch's: on a module that had decoded nothing yet, that raised KeyError."""
    for stream in ("decode_stream", "session"):
        pair = WanPair("wan2.1", torch.float32)
        for vae in (pair.reference, pair.optimized):
            vae.enable_slicing()
        z = pair.latents(2, 3, seed=4)
        expected = pair.reference.decode(z).sample
        if stream == "decode_stream":
            actual = torch.cat([p for _, p in pair.optimized.decode_stream(z)], 2)
        else:
            with StreamSession(pair.optimized, batch=2, height=4, width=6) as session:
                actual = push_all(session, z, (1, 2))
        assert torch.equal(actual, expected), stream
        assert report(pair.optimized).last_path == "graphs", (stream, report(pair.optimized).last_reason)


@torch.no_grad()
def test_decode_stream_checks_latents_at_the_call_and_is_removed_at_level_off():
    vae = optimize(build_wan("wan2.1", "tiny"))
    with pytest.raises(ValueError, match="Wan latents must be"):
        vae.decode_stream(torch.zeros(1, 5, 2, 4, 6))  # before any piece is asked for
    optimize(vae, "off")
    assert "decode_stream" not in vae.__dict__ and not hasattr(vae, "decode_stream")
    optimize(vae)
    assert callable(vae.decode_stream)


@torch.no_grad()
def test_decode_stream_slices_as_decode_does_and_tiled_sizes_come_as_one_piece(wan_pair):
    pair = wan_pair("wan2.1")
    z = pair.latents(2, 3, seed=4)
    ratio = pair.reference.spatial_compression_ratio
    try:
        for vae in (pair.reference, pair.optimized):
            vae.enable_slicing()
        expected = pair.reference.decode(z).sample
        assert torch.equal(torch.cat([p for _, p in pair.optimized.decode_stream(z)], 2), expected)
        with StreamSession(pair.optimized, batch=2, height=4, width=6) as session:
            assert torch.equal(push_all(session, z, (1, 2)), expected)
        for vae in (pair.reference, pair.optimized):
            vae.enable_tiling(tile_sample_min_height=4 * ratio, tile_sample_min_width=4 * ratio,
                              tile_sample_stride_height=3 * ratio, tile_sample_stride_width=3 * ratio)
        tiled = pair.latents(1, 2, 5, 6, seed=5)
        pieces = list(pair.optimized.decode_stream(tiled))
        assert len(pieces) == 1 and pieces[0][0] == 0
        assert torch.equal(pieces[0][1], pair.reference.decode(tiled).sample)
        with pytest.raises(ValueError, match="tiled"):
            rewrite.stream(pair.optimized, height=5, width=6)
    finally:
        for vae in (pair.reference, pair.optimized):
            vae.disable_slicing()
            vae.disable_tiling()


# ------------------------------------------------------------------------------------------ sessions


@torch.no_grad()
@pytest.mark.parametrize("sizes,version,batch", quick.product({"+".join(map(str, s)): (s,) for s in CHUNKINGS},
                                                              {f"{v}-b{b}": (v, b) for v in VERSIONS for b in (1, 2)}))
def test_session_pushes_are_the_decode_of_the_whole_clip(wan_pair, version, batch, sizes):
    pair = wan_pair(version)
    z = pair.latents(batch, sum(sizes), seed=sum(sizes) + batch)
    with rewrite.stream(pair.optimized, batch=batch, height=4, width=6) as session:
        got = [session.push(c) for c in chunks_of(z, sizes)]
        assert session.latent_frames == sum(sizes) and session.output_frames == 1 + 4 * (sum(sizes) - 1)
    assert [g.shape[2] for g in got] == [1 + 4 * (sizes[0] - 1)] + [4 * n for n in sizes[1:]]
    assert torch.equal(torch.cat(got, 2), pair.reference.decode(z).sample)
    assert report(pair.optimized).last_path == "graphs"


@torch.no_grad()
def test_session_in_bf16(wan_pair):
    pair = wan_pair("wan2.1", torch.bfloat16)
    z = pair.latents(2, 5, seed=7)
    session = rewrite.stream(pair.optimized, batch=2, height=4, width=6)
    assert session.dtype == torch.bfloat16
    assert torch.equal(push_all(session, z, (2, 1, 2)), pair.reference.decode(z).sample)
    assert torch.equal(torch.cat([p for _, p in pair.optimized.decode_stream(z)], 2), pair.reference.decode(z).sample)


@torch.no_grad()
@pytest.mark.parametrize("version", VERSIONS)
def test_reset_starts_a_new_clip(wan_pair, version):
    pair = wan_pair(version)
    session = rewrite.stream(pair.optimized, height=4, width=6)
    for seed, frames, sizes in ((1, 5, (2, 3)), (2, 1, (1,)), (3, 4, (1, 3))):
        z = pair.latents(1, frames, seed=seed)
        session.push(z[:, :, :1])  # a clip abandoned half way
        session.reset()
        assert session.latent_frames == 0 and session.output_frames == 0
        assert torch.equal(push_all(session, z, sizes), pair.reference.decode(z).sample), seed
        session.reset()


@torch.no_grad()
@pytest.mark.parametrize("steps", ("eager", "static"))
def test_interleaved_sessions_and_decodes_between_pushes_keep_every_clip_exact(wan_pair, static_steps, saves, steps):
    """Two sessions and a decode_stream of one shape, and plain decodes, taking turns: each clip's state is
    its own (on the CUDA-graph path the paused clip is handed a copy of the shared static caches)."""
    pair = static_steps("wan2.2") if steps == "static" else wan_pair("wan2.2")
    za, zb, zs, zp = (pair.latents(2, 5, seed=s) for s in (11, 12, 13, 14))
    expected = {name: pair.reference.decode(z).sample for name, z in (("a", za), ("b", zb), ("s", zs), ("p", zp))}
    a = rewrite.stream(pair.optimized, batch=2, height=4, width=6)
    b = rewrite.stream(pair.optimized, batch=2, height=4, width=6)
    streamed = pair.optimized.decode_stream(zs)
    got = {"a": [], "b": [], "s": []}
    for ca, cb in zip(chunks_of(za, (1, 2, 1, 1)), chunks_of(zb, (2, 1, 1, 1))):
        got["a"].append(a.push(ca))
        got["s"].append(next(streamed)[1])
        assert torch.equal(pair.optimized.decode(zp).sample, expected["p"])
        got["b"].append(b.push(cb))
    got["s"] += [piece for _, piece in streamed]
    for name, pieces in got.items():
        assert torch.equal(torch.cat(pieces, 2), expected[name]), name
    if steps == "static":
        assert saves[0] > 0 and len(installed_runner(pair.optimized).cuda_graphs) == 1
    else:
        assert saves[0] == 0


@torch.no_grad()
def test_a_session_alone_on_its_shape_copies_no_caches(static_steps, saves):
    pair = static_steps("wan2.1")
    z = pair.latents(1, 5, seed=21)
    with rewrite.stream(pair.optimized, height=4, width=6) as session:
        assert torch.equal(push_all(session, z, (1, 1, 1, 2)), pair.reference.decode(z).sample)
    assert saves[0] == 0


@torch.no_grad()
def test_a_session_survives_its_steps_being_dropped_or_cuda_graphs_turned_off(static_steps):
    """The shared steps may be evicted or recaptured between pushes (the paused clip keeps the ones it is in),
    and a failed capture turns the CUDA graphs off: the clip continues from its own caches."""
    pair = static_steps("wan2.1")
    runner = installed_runner(pair.optimized)
    z = pair.latents(1, 5, seed=22)
    session = rewrite.stream(pair.optimized, height=4, width=6)
    got = [session.push(z[:, :, :2])]
    runner.cuda_graphs.clear()  # as eviction, recapture or moved weights do
    got.append(session.push(z[:, :, 2:3]))
    runner.use_cuda_graphs = False
    try:
        got.append(session.push(z[:, :, 3:5]))
    finally:
        runner.use_cuda_graphs = True
    assert torch.equal(torch.cat(got, 2), pair.reference.decode(z).sample)


@torch.no_grad()
def test_sessions_in_threads_share_a_module(wan_pair):
    pair = wan_pair("wan2.1")
    inputs = [pair.latents(1, 5, seed=30 + i) for i in range(3)]
    expected = [pair.reference.decode(z).sample for z in inputs]

    def run(i):
        with rewrite.stream(pair.optimized, height=4, width=6) as session:
            return push_all(session, inputs[i], (1, 2, 1, 1))

    for i, got in enumerate(run_threads(3, run)):
        assert torch.equal(got, expected[i]), i


@torch.no_grad()
def test_a_session_keeps_no_growing_buffer(wan_pair):
    pair = wan_pair("wan2.1")
    session = rewrite.stream(pair.optimized, height=4, width=6)
    z = pair.latents(1, 9, seed=23)
    sizes = []
    for i in range(9):
        session.push(z[:, :, i : i + 1])
        state = session._clip.states[0]
        sizes.append(sum(t.numel() for t in state.feat_map if isinstance(t, torch.Tensor)))
    assert len(set(sizes[1:])) == 1  # the caches only, the same size from the second frame on


# ------------------------------------------------------------------------------------------ fallbacks


def own_fallback_log(monkeypatch, vae) -> None:
    """A fresh fallback log for this test: the shared pair's log warns once per reason, for other tests too."""
    monkeypatch.setattr(installed_runner(vae), "fallbacks", FallbackLog())


@pytest.mark.parametrize("version", VERSIONS)
def test_a_session_switches_to_the_reference_and_back_mid_clip_exactly(wan_pair, version, caplog, monkeypatch):
    """Autograd on (parameters require grad) sends a push to the reference decoder, which continues from the
    clip's caches; a first frame the reference decoded leaves caches in its chunk-1 form, which the next frame
    also takes the reference for; then the graphs continue."""
    pair = wan_pair(version)
    own_fallback_log(monkeypatch, pair.optimized)
    z = pair.latents(2, 6, seed=40)
    with torch.no_grad():
        expected = pair.reference.decode(z).sample
    session = rewrite.stream(pair.optimized, batch=2, height=4, width=6)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        got = [session.push(z[:, :, :1])]  # grad mode on: the reference decodes chunk 0
    assert report(pair.optimized).last_path == "reference" and "autograd" in report(pair.optimized).last_reason
    assert "reference path taken" in caplog.text and "autograd" in caplog.text
    with torch.no_grad():
        got.append(session.push(z[:, :, 1:2]))  # the reference's chunk-1 form: the reference again
        assert "chunk-1 form" in report(pair.optimized).last_reason
        got.append(session.push(z[:, :, 2:4]))
        assert report(pair.optimized).last_path == "graphs"
    got.append(session.push(z[:, :, 4:5]))  # back to the reference, from the graphs' steady caches
    assert report(pair.optimized).last_path == "reference"
    with torch.no_grad():
        got.append(session.push(z[:, :, 5:6]))
    assert torch.equal(torch.cat(got, 2).detach(), expected)


@torch.no_grad()
def test_a_hook_added_between_pieces_sends_the_rest_to_the_reference(static_steps, monkeypatch):
    pair = static_steps("wan2.1")
    own_fallback_log(monkeypatch, pair.optimized)
    z = pair.latents(1, 4, seed=41)
    expected = pair.reference.decode(z).sample
    pieces, handle = [], None
    try:
        for i, (_, piece) in enumerate(pair.optimized.decode_stream(z)):
            pieces.append(piece)
            if i == 1:
                handle = pair.optimized.decoder.mid_block.register_forward_hook(lambda *args: None)
        assert "hook" in report(pair.optimized).last_reason and "mid_block" in report(pair.optimized).last_reason
    finally:
        handle.remove()
    assert torch.equal(torch.cat(pieces, 2), expected)


def test_the_post_quant_conv_check_holds_for_the_tested_shapes_and_a_failing_one_raises(wan_pair, monkeypatch):
    pair = wan_pair("wan2.2")
    conv = pair.optimized.post_quant_conv
    like = pair.latents(2, 1)
    assert all(frame_local_post_quant_conv(conv, b, f, like) for b in (1, 2) for f in range(1, 7))
    z = pair.latents(1, 4, seed=42)
    session = rewrite.stream(pair.optimized, height=4, width=6)
    with torch.no_grad():
        first = session.push(z[:, :, :2])
        monkeypatch.setattr(stream_module, "frame_local_post_quant_conv", lambda conv, batch, frames, like: frames != 3)
        with pytest.raises(RuntimeError, match="post_quant_conv over a 3-frame clip"):
            session.push(z[:, :, 2:3])
        assert session.latent_frames == 2  # the clip is as it was
        rest = session.push(z[:, :, 2:4])
        assert torch.equal(torch.cat([first, rest], 2), pair.reference.decode(z).sample)


# ------------------------------------------------------------------------------------------ bad use


def test_bad_use_is_a_clear_error():
    vae = optimize(build_wan("wan2.1", "tiny"))
    session = rewrite.stream(vae, batch=2, height=4, width=6)
    good = torch.zeros(2, 4, 1, 4, 6)
    with pytest.raises(TypeError, match="latent tensor"):
        session.push(good.numpy())
    for shape in ((1, 4, 1, 4, 6), (2, 5, 1, 4, 6), (2, 4, 0, 4, 6), (2, 4, 1, 6, 4), (2, 4, 1, 4, 5), (2, 4, 4, 6)):
        with pytest.raises(ValueError, match="push expects latents"):
            session.push(torch.zeros(shape))
    with pytest.raises(ValueError, match="decodes torch.float32 on cpu"):
        session.push(good.to(torch.bfloat16))
    with pytest.raises(ValueError, match="decodes torch.float32 on cpu"):
        session.push(good.to("meta"))
    with session:
        pass
    assert session.closed
    with pytest.raises(RuntimeError, match="closed"):
        session.push(good)
    with pytest.raises(RuntimeError, match="closed"):
        session.reset()
    session.close()  # idempotent


def test_bad_session_arguments_and_modules():
    vae = optimize(build_wan("wan2.1", "tiny"))
    for bad in (dict(batch=0), dict(height=True), dict(width=2.0)):
        args = dict(batch=1, height=4, width=6) | bad
        with pytest.raises(ValueError, match="positive int"):
            rewrite.stream(vae, **args)
    with pytest.raises(TypeError, match="optimized AutoencoderKLWan"):
        rewrite.stream(build_wan("wan2.1", "tiny"), height=4, width=6)
    micro = AuKConfig(latent_dim=8, upsample_rates=(2,), upsample_kernel_sizes=(4,), upsample_initial_channel=8,
                      resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1,),))
    with pytest.raises(TypeError, match="decode_tiles"):
        rewrite.stream(optimize(AuKVAE(micro).eval()), height=4, width=6)
    with pytest.raises(TypeError, match="torch.dtype"):
        rewrite.stream(vae, height=4, width=6, dtype="float32")


def test_a_session_refuses_a_vae_optimized_again_until_reset():
    vae = optimize(build_wan("wan2.1", "tiny"))
    session = rewrite.stream(vae, height=4, width=6)
    optimize(vae, "off")
    with pytest.raises(RuntimeError, match="optimized again or un-optimized"):
        session.push(torch.zeros(1, 4, 1, 4, 6))
    with pytest.raises(RuntimeError, match="no longer optimized"):
        session.reset()
    optimize(vae)
    session.reset()  # takes the new runner
    assert session._runner is installed_runner(vae)
    optimize(vae)  # the same level and options keep the runner: the session goes on
    assert session._runner is installed_runner(vae)


def test_a_deep_copy_streams_with_its_own_runner(wan_pair):
    pair = wan_pair("wan2.1")
    twin = copy.deepcopy(pair.optimized)
    z = pair.latents(1, 3, seed=50)
    with torch.no_grad(), rewrite.stream(twin, height=4, width=6) as session:
        assert torch.equal(push_all(session, z, (1, 2)), pair.reference.decode(z).sample)


# ------------------------------------------------------------------------------------------ GPU


def _cuda_pair(version, dtype=torch.bfloat16, size="tiny"):
    reference = build_wan(version, size).to("cuda", dtype)
    return reference, optimize(copy.deepcopy(reference))


def _cuda_latents(vae, batch, frames, height, width, seed):
    shape = (batch, vae.config.z_dim, frames, height, width)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to("cuda", next(vae.parameters()).dtype)


@pytest.mark.gpu
@torch.no_grad()
@pytest.mark.parametrize("version", VERSIONS)
def test_gpu_streams_and_sessions_interleaved_on_the_cuda_graphs(version):
    reference, vae = _cuda_pair(version)
    za, zb, zs, zp = (_cuda_latents(vae, 2, 5, 4, 6, seed) for seed in range(4))
    expected = [reference.decode(z).sample for z in (za, zb, zs, zp)]
    a, b = rewrite.stream(vae, batch=2, height=4, width=6), rewrite.stream(vae, batch=2, height=4, width=6)
    streamed = vae.decode_stream(zs)
    got = [[], [], []]
    for ca, cb in zip(chunks_of(za, (1, 2, 2)), chunks_of(zb, (2, 2, 1))):
        got[0].append(a.push(ca))
        got[2].append(next(streamed)[1])
        assert torch.equal(vae.decode(zp).sample, expected[3])
        got[1].append(b.push(cb))
    got[2] += [piece for _, piece in streamed]
    for i in range(3):
        assert torch.equal(torch.cat(got[i], 2), expected[i]), i
    assert report(vae).cuda_graphs == {"CUDA graph shapes": 1}


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_session_pushes_from_a_side_stream_between_default_stream_decodes():
    reference, vae = _cuda_pair("wan2.1")
    z, other = _cuda_latents(vae, 1, 5, 4, 6, 7), _cuda_latents(vae, 1, 3, 4, 6, 8)
    expected, expected_other = reference.decode(z).sample, reference.decode(other).sample
    session, side, got = rewrite.stream(vae, height=4, width=6), torch.cuda.Stream(), []
    for chunk in chunks_of(z, (1, 2, 2)):
        assert torch.equal(vae.decode(other).sample, expected_other)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got.append(session.push(chunk))
        torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(torch.cat(got, 2), expected)


@pytest.mark.gpu
@torch.no_grad()
@pytest.mark.parametrize("version", VERSIONS)
def test_gpu_full_size_session_and_stream_at_480p(version):
    """Also the post_quant_conv check at a real size: a failing check raises here (the lead's GPU run)."""
    reference, vae = _cuda_pair(version, size="full")
    ratio = vae.spatial_compression_ratio
    z = _cuda_latents(vae, 1, 6, 480 // ratio, 832 // ratio, 9)
    expected = reference.decode(z).sample
    assert torch.equal(torch.cat([p for _, p in vae.decode_stream(z)], 2), expected)
    with rewrite.stream(vae, height=480 // ratio, width=832 // ratio) as session:
        assert torch.equal(push_all(session, z, (1, 2, 3)), expected)
    assert report(vae).last_path == "graphs"
