"""AuK runtime on CPU: routing, buckets, tiling, streaming and CUDA-graph pool management.

CUDA graphs cannot be captured on CPU, so the runner gets a fake graph backend
(`tests.graph_fakes.FakeGraphs`): a "capture" records its shape and pool, and a "replay" runs the captured
graph eagerly and copies the result into a persistent output buffer, the way a real replay overwrites its
static outputs (so a runner that forgot to copy an output out would see it change under it). Everything else
(the exported graph, the rewrite passes, padding, window planning, stitching) is the production code.

A micro decoder (two upsample stages, hop 4, one residual kernel) keeps the decodes fast: its decode context
is (41, 10) latent frames, so windows of 64 frames leave 13 emitted frames each.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from rewrite import optimize, report, warmup
from rewrite.models.auk.capture import reference_decode
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.auk.runner import tile_batches
from rewrite.runtime.tiles import plan_tiles
from tests.graph_fakes import FakeGraphs

MICRO = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                  resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))
HOP = MICRO.hop_length


@pytest.fixture(scope="module")
def micro_vae():
    torch.manual_seed(0)
    return AuKVAE(MICRO).eval()


def latents(batch, frames, seed=1):
    return torch.randn(batch, frames, MICRO.latent_dim, generator=torch.Generator().manual_seed(seed))


def optimized(vae, level="channels_last", **options):
    backend = options.pop("graph_backend", None) or FakeGraphs()
    return optimize(copy.deepcopy(vae), level, graph_backend=backend, **options), backend


def test_tile_batches():
    assert tile_batches(5) == [5]
    assert tile_batches(13) == [8, 5]
    assert tile_batches(1) == [1]
    assert tile_batches(16, largest=8) == [8, 8]
    assert tile_batches(0) == []


@torch.no_grad()
def test_lossless_exact_length_graphs_are_bit_identical_and_retired_as_a_generation(micro_vae):
    vae, backend = optimized(micro_vae, "lossless", max_graphs=2)
    for frames in (10, 11, 12, 11):
        z = latents(1, frames, seed=frames)
        assert torch.equal(vae.decode(z), reference_decode(micro_vae, z))
        assert report(vae).last_detail == f"CUDA graph, exact length {frames}"
    runner = vae._rewrite_runner
    # 10 and 11 filled the first pool; 12 retired that whole generation; 11 came back into the second pool.
    assert [shape[1] for shape, _ in backend.captured] == [10, 11, 12, 11]
    assert [pool for _, pool in backend.captured] == [1, 1, 2, 2]
    assert runner.exact_graphs.generation == 1 and len(runner.exact_graphs) == 2
    assert len(runner.bucket_graphs) == 0  # lossless never pads


@torch.no_grad()
def test_lossless_never_pads_or_tiles_a_long_clip(micro_vae):
    vae, backend = optimized(micro_vae, "lossless", compile_shapes=(64,))
    z = latents(1, 150)
    assert torch.equal(vae.decode(z), reference_decode(micro_vae, z))
    assert backend.captured == [((1, 150, MICRO.latent_dim), 1)]
    assert [start for start, _ in vae.decode_tiles(z)] == [0]


@torch.no_grad()
def test_channels_last_pads_to_the_smallest_bucket(micro_vae):
    vae, backend = optimized(micro_vae, compile_shapes=(96, 64))
    z = latents(2, 50)
    out = vae.decode(z)
    assert report(vae).last_detail == "CUDA graph, bucket 64 (50 frames padded)"
    assert backend.captured == [((2, 64, MICRO.latent_dim), 1)]
    # Exactly the eager decode of the padded latents, cut to the clip ...
    padded = torch.cat([z, micro_vae.pad_latent().expand(2, 14, -1)], dim=1)
    assert torch.equal(out, reference_decode(micro_vae, padded)[:, : 50 * HOP])
    # ... which differs from the unpadded decode only in the last samples, where the activations'
    # replicate padding sees decoded pad frames instead of the clip end (the decode context reaches 10
    # frames right; measured differences stay within the last 2 frames and below 1e-3).
    reference = reference_decode(micro_vae, z)
    assert torch.equal(out[:, : 40 * HOP], reference[:, : 40 * HOP])
    assert (out - reference).abs().max() < 1e-3
    # A clip of exactly a bucket's length is not padded; one above every bucket (tile_frames larger
    # than the buckets) gets an exact-length graph.
    vae.decode(latents(2, 96))
    assert report(vae).last_detail == "CUDA graph, bucket 96"


@torch.no_grad()
def test_channels_last_exact_length_when_no_bucket_serves(micro_vae):
    vae, backend = optimized(micro_vae, compile_shapes=(64,), tile_frames=100)
    z = latents(1, 80)
    assert torch.equal(vae.decode(z), reference_decode(micro_vae, z))
    assert report(vae).last_detail == "CUDA graph, exact length 80"
    assert len(vae._rewrite_runner.exact_graphs) == 1 and len(vae._rewrite_runner.bucket_graphs) == 0


@torch.no_grad()
def test_tiled_decode_stitches_windows_exactly(micro_vae):
    """Each emitted range is bit for bit what an eager decode of the batch its window was replayed in emits
    there (the same ops on the same shapes); the stitched clip is the whole decode within the tiling contract
    (max-abs <= 1e-4): a CPU conv (oneDNN) may round differently for another batch or length, so equality
    with the whole-clip decode is not promised."""
    vae, backend = optimized(micro_vae, compile_shapes=(64, 96), tile_frames=96)
    z = latents(2, 240)
    out = vae.decode(z)
    windows = plan_tiles(240, 96, *micro_vae.decode_context_frames(), sizes=(64, 96))
    assert len(windows) > 3 and windows[-1].window_frames == 64
    # Equal-width windows ran as one batched graph (window-major along the batch), all in the one bucket pool.
    full = [w for w in windows if w.window_frames == 96]
    batches = sorted(shape[0] for shape, _ in backend.captured if shape[1] == 96)
    assert batches == [2 * len(full)]
    assert {pool for _, pool in backend.captured} == {1}
    assert report(vae).last_detail == f"CUDA graphs, {len(windows)} tiled windows of 96/64 frames"
    stacked = reference_decode(micro_vae, torch.cat([z[:, w.window_start : w.window_start + 96] for w in full]))
    for w in windows:
        if w.window_frames == 96:
            i = full.index(w)
            window_wave = stacked[2 * i : 2 * i + 2]
        else:
            window_wave = reference_decode(micro_vae, z[:, w.window_start : w.window_start + w.window_frames])
        offset = w.emit_start - w.window_start
        expected = window_wave[:, offset * HOP : (offset + w.emit_end - w.emit_start) * HOP]
        assert torch.equal(out[:, w.emit_start * HOP : w.emit_end * HOP], expected), w
    # The halo is the decode context, so the stitched clip is the whole decode up to rounding.
    assert (out - reference_decode(micro_vae, z)).abs().max() <= 1e-4


@torch.no_grad()
def test_decode_tiles_streams_every_frame_once_in_order(micro_vae):
    vae, _ = optimized(micro_vae, compile_shapes=(64,))
    z = latents(1, 200)
    whole = vae.decode(z)
    pieces = list(vae.decode_tiles(z))
    starts = [start for start, _ in pieces]
    assert starts[0] == 0 and starts == sorted(starts) and len(pieces) > 2
    ends = starts[1:] + [200]
    assert all(p.shape == (1, (end - start) * HOP) for (start, p), end in zip(pieces, ends))
    # Streaming replays one window at a time where `decode` batches equal-width windows; the batch size
    # may change the convolution algorithm and so the last bits (fp32: a few ulp of |y| <= 1).
    torch.testing.assert_close(torch.cat([p for _, p in pieces], dim=1), whole, rtol=0, atol=1e-5)
    # A short clip is one piece.
    assert [start for start, _ in vae.decode_tiles(latents(1, 30))] == [0]


@torch.no_grad()
def test_outputs_survive_later_replays(micro_vae):
    vae, _ = optimized(micro_vae, compile_shapes=(64,))
    first = vae.decode(latents(1, 60, seed=3))
    kept = first.clone()
    vae.decode(latents(1, 60, seed=4))  # same graph, replayed with other latents
    assert torch.equal(first, kept)


@torch.no_grad()
def test_warmup_captures_buckets_largest_first_into_one_pool(micro_vae):
    vae, backend = optimized(micro_vae, compile_shapes=(64, 128, 96))
    warmup(vae, batch=2)
    assert backend.captured == [((2, width, MICRO.latent_dim), 1) for width in (128, 96, 64)]
    vae.decode(latents(2, 70))  # served by the warmed bucket: nothing new captured
    assert len(backend.captured) == 3 and report(vae).last_detail == "CUDA graph, bucket 96 (70 frames padded)"
    lossless, lossless_backend = optimized(micro_vae, "lossless")
    warmup(lossless, frames=(20, 30))
    assert [shape for shape, _ in lossless_backend.captured] == [(1, 30, 8), (1, 20, 8)]


@torch.no_grad()
def test_capture_failure_runs_the_graph_eagerly_and_is_reported(micro_vae, caplog):
    vae, _ = optimized(micro_vae, "lossless", graph_backend=FakeGraphs(fail=True))
    z = latents(1, 20)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        assert torch.equal(vae.decode(z), reference_decode(micro_vae, z))
    summary = report(vae)
    assert summary.last_path == "graphs" and summary.last_detail.startswith("graph run eagerly (capture failed)")
    assert any("CUDA graph capture failed for 1x20 frames" in reason for reason in summary.fallbacks)
    assert "CUDA graph capture failed" in caplog.text
    assert torch.equal(vae.decode(z), reference_decode(micro_vae, z))  # not retried, still right


@torch.no_grad()
def test_replaced_weights_retire_the_graphs(micro_vae):
    vae, backend = optimized(micro_vae, "lossless")
    z = latents(1, 20)
    vae.decode(z)
    state = {k: v.clone() * 0.5 for k, v in vae.state_dict().items()}
    vae.load_state_dict(state, assign=True)
    expected = reference_decode(vae, z)
    assert torch.equal(vae.decode(z), expected)
    assert len(backend.captured) == 2 and vae._rewrite_runner.exact_graphs.generation == 1


@torch.no_grad()
def test_without_cuda_the_graph_runs_eagerly(micro_vae):
    vae = optimize(copy.deepcopy(micro_vae), "channels_last")  # the real CUDA-graph backend, CPU tensors
    z = latents(1, 30)
    vae.decode(z)
    assert report(vae).last_detail == "graph run eagerly (no CUDA graphs on cpu)"
    warmup(vae)  # exports the graph, captures nothing on CPU


def test_option_errors(micro_vae):
    with pytest.raises(ValueError, match="tile_frames must exceed the decode context"):
        optimize(copy.deepcopy(micro_vae), "channels_last", tile_frames=51)
    with pytest.raises(ValueError, match="compile_shapes"):
        optimize(copy.deepcopy(micro_vae), "channels_last", compile_shapes=())
    with pytest.raises(ValueError, match="compile_shapes must be a non-empty sequence"):
        optimize(copy.deepcopy(micro_vae), "channels_last", compile_shapes=64)
    with pytest.raises(ValueError, match="compile_shapes must be a non-empty sequence"):
        optimize(copy.deepcopy(micro_vae), "channels_last", compile_shapes=iter(()))
    with pytest.raises(ValueError, match=r"tile_frames \(default: the largest compile_shapes entry\)"):
        optimize(copy.deepcopy(micro_vae), "channels_last", compile_shapes=(32, 40))
    with pytest.raises(ValueError, match="max_graphs"):
        optimize(copy.deepcopy(micro_vae), "lossless", max_graphs=0)
    with pytest.raises(TypeError, match="bucket_frames"):
        optimize(copy.deepcopy(micro_vae), "lossless", bucket_frames=3)
    with pytest.raises(RuntimeError, match="not optimized"):
        warmup(copy.deepcopy(micro_vae))


@torch.no_grad()
def test_reoptimizing_with_other_options_builds_a_new_runner(micro_vae):
    vae, _ = optimized(micro_vae, compile_shapes=(64,))
    runner = vae._rewrite_runner
    optimize(vae, "channels_last", compile_shapes=(64,))
    assert vae._rewrite_runner is runner
    optimize(vae, "channels_last", compile_shapes=(64, 96))
    assert vae._rewrite_runner is not runner and vae._rewrite_runner.compile_shapes == (64, 96)
    optimize(vae, "off")
    assert "decode_tiles" not in vae.__dict__ and "decode" not in vae.__dict__


@torch.no_grad()
def test_tiled_decode_reports_eager_windows_when_captures_failed(micro_vae):
    vae, _ = optimized(micro_vae, compile_shapes=(64,), graph_backend=FakeGraphs(fail=True))
    z = latents(1, 200)
    # Windows run eagerly, stacked 8 and 4 to a batch (the batch may change the last bits, as when streaming).
    torch.testing.assert_close(vae.decode(z), reference_decode(micro_vae, z), rtol=0, atol=1e-5)
    assert report(vae).last_detail.startswith("CUDA graphs (eager where capture failed), ")
    pieces = list(vae.decode_tiles(z))
    assert len(pieces) > 2 and report(vae).last_detail.startswith("CUDA graphs (eager where capture failed), ")


def test_warmup_needs_no_no_grad(micro_vae):
    """Like Wan's, AuK's warmup captures for no-grad decodes itself (parameters require grad by default)."""
    vae, backend = optimized(micro_vae, compile_shapes=(64,))
    assert torch.is_grad_enabled() and next(vae.parameters()).requires_grad
    warmup(vae)
    assert backend.captured == [((1, 64, MICRO.latent_dim), 1)]
    assert torch.is_grad_enabled()


def test_graphs_captured_in_inference_mode_serve_no_grad_decodes(micro_vae):
    for level in ("lossless", "channels_last"):
        vae, backend = optimized(micro_vae, level, compile_shapes=(64,))
        z = latents(1, 50)
        with torch.inference_mode():
            first = vae.decode(z)
        with torch.no_grad():
            again = vae.decode(z)  # replays the graph captured in inference mode: its static input is written
        assert len(backend.captured) == 1 and torch.equal(first, again)


@torch.no_grad()
def test_deepcopy_after_cuda_graph_captures_gives_the_copy_its_own_graphs(micro_vae):
    vae, _ = optimized(micro_vae, compile_shapes=(64,), graph_backend=FakeGraphs(cuda_like=True))
    z = latents(1, 50)
    vae.decode(z)
    twin = copy.deepcopy(vae)  # CUDA graphs cannot be copied: the copy starts with empty pools of its own
    runner, twin_runner = vae._rewrite_runner, twin._rewrite_runner
    assert twin_runner.vae is twin and len(twin_runner.bucket_graphs) == 0
    twin.decoder.conv_post.weight.mul_(0.5)
    expected = reference_decode(twin, torch.cat([z, twin.pad_latent().expand(1, 14, -1)], dim=1))[:, : 50 * HOP]
    assert torch.equal(twin.decode(z), expected)
    assert twin_runner.bucket_graphs._pool is not runner.bucket_graphs._pool  # never one pool for two runners
    assert len(runner.bucket_graphs) == 1 and not torch.equal(vae.decode(z), expected)


@torch.no_grad()
def test_weights_replaced_while_streaming_are_seen_by_the_next_pieces(micro_vae):
    vae, _ = optimized(micro_vae, compile_shapes=(64,))
    z = latents(1, 200)
    stream = vae.decode_tiles(z)
    next(stream)
    halved = copy.deepcopy(micro_vae)
    with torch.no_grad():
        for p in halved.parameters():
            p.mul_(0.5)
    vae.load_state_dict(halved.state_dict(), assign=True)  # new tensors: the old graphs must not replay
    windows = {w.emit_start: w for w in vae._rewrite_runner.plan(200)}
    for start, piece in stream:
        w = windows[start]
        window_wave = reference_decode(halved, z[:, w.window_start : w.window_start + w.window_frames])
        offset = w.emit_start - w.window_start
        assert torch.equal(piece, window_wave[:, offset * HOP : (offset + w.emit_end - w.emit_start) * HOP]), w


@torch.no_grad()
def test_reoptimizing_is_configured_by_this_call_and_a_failed_call_changes_nothing(micro_vae):
    vae, _ = optimized(micro_vae, compile_shapes=(96, 64))
    runner = vae._rewrite_runner
    optimize(vae, "channels_last", compile_shapes=[64, 96, 64])  # the same buckets, spelled otherwise
    assert vae._rewrite_runner is runner
    with pytest.raises(ValueError, match="tile_frames"):
        optimize(vae, "channels_last", tile_frames=5)
    with pytest.raises(TypeError, match="bucket_frames"):
        optimize(vae, "channels_last", bucket_frames=3)
    assert vae._rewrite_runner is runner and "decode" in vae.__dict__  # still optimized as before
    optimize(vae, "channels_last")  # no options: the defaults, not the previous call's options
    assert vae._rewrite_runner.options == {"compile_shapes": (160, 320, 640), "tile_frames": 640, "max_graphs": 8,
                                           "cudnn_benchmark": False, "cache_dir": None}


@torch.no_grad()
def test_cudnn_benchmark_is_a_channels_last_option(micro_vae):
    """Off by default; allowed at channels_last only: at lossless it would change the convolution
    algorithms, and so the bits, against eager decoding."""
    with pytest.raises(ValueError, match="cudnn_benchmark=True needs level 'channels_last'"):
        optimize(micro_vae, "lossless", cudnn_benchmark=True)
    with pytest.raises(ValueError, match="cudnn_benchmark must be a bool"):
        optimize(micro_vae, "channels_last", cudnn_benchmark="yes")
    assert optimize(micro_vae, "lossless")._rewrite_runner.cudnn_benchmark is False
    assert optimize(micro_vae, "channels_last")._rewrite_runner.cudnn_benchmark is False
    assert optimize(micro_vae, "channels_last", cudnn_benchmark=True)._rewrite_runner.cudnn_benchmark is True


def test_cudnn_benchmarking_restores_the_global_flag():
    from rewrite.models.auk.runner import cudnn_benchmarking

    before = torch.backends.cudnn.benchmark
    with cudnn_benchmarking():
        assert torch.backends.cudnn.benchmark is True
    assert torch.backends.cudnn.benchmark == before


def _hook(*args):
    return None


CHANGES = {
    "forward hook": lambda vae: vae.decoder.resblocks[0].convs1[0].register_forward_hook(_hook),
    "forward pre-hook": lambda vae: vae.decoder.conv_post.register_forward_pre_hook(_hook),
    "instance forward": lambda vae: setattr(vae.decoder.conv_pre, "forward", vae.decoder.conv_pre.forward),
    "global hook": lambda vae: torch.nn.modules.module.register_module_forward_hook(_hook),
    "assigned weights": lambda vae: vae.load_state_dict({k: v * 0.5 for k, v in vae.state_dict().items()}, assign=True),
    "weight data swapped": lambda vae: setattr(vae.decoder.conv_pre.weight, "data", vae.decoder.conv_pre.weight.data * 0.5),
    "submodule replaced": lambda vae: setattr(vae.decoder, "conv_post", copy.deepcopy(vae.decoder.conv_post)),
}


@pytest.mark.parametrize("change", list(CHANGES))
@torch.no_grad()
def test_a_change_after_an_accepted_call_is_checked_in_full(micro_vae, change):
    """The guards' cheap re-check (`AcceptedState`) must notice everything the full checks look at: hooks and
    forward wrappers send the call to the reference path, replaced weights retire the graphs."""
    vae, backend = optimized(micro_vae, "lossless")
    z = latents(1, 20)
    vae.decode(z)
    runner = vae._rewrite_runner
    accepted = runner._accepted[(z.dtype, z.device)]
    assert accepted.holds(vae.decoder)
    handle = CHANGES[change](vae)
    try:
        assert not accepted.holds(vae.decoder)
        out = vae.decode(z)
        assert torch.equal(out, reference_decode(vae, z))
        hooked = "hook" in change or change == "instance forward"
        assert report(vae).last_path == ("reference" if hooked else "graphs"), change
        if not hooked:
            assert runner.exact_graphs.generation == 1 and len(backend.captured) == 2
            assert runner._accepted[(z.dtype, z.device)].holds(vae.decoder)  # accepted again, for the new weights
    finally:
        if handle is not None and hasattr(handle, "remove"):
            handle.remove()


@torch.no_grad()
def test_pad_latent_follows_in_place_updates_of_the_latent_statistics(micro_vae):
    """The runner keeps the pad latent and the padded tail of a graph's static input between calls; both must
    follow in-place updates of the latent statistics."""
    vae, backend = optimized(micro_vae, compile_shapes=(64,))
    runner = vae._rewrite_runner
    first = runner.pad_latent()
    assert torch.equal(first, vae.pad_latent()) and runner.pad_latent() is first  # cached
    for step, seed in enumerate((1, 2, 3)):
        if step == 2:
            vae.global_mean.add_(0.25)  # in place: a new pad latent, and the static tail written again
            assert not torch.equal(runner.pad_latent(), first)
        z = latents(2, 50, seed=seed)
        padded = torch.cat([z, vae.pad_latent().expand(2, 14, -1)], dim=1)
        assert torch.equal(vae.decode(z), reference_decode(vae, padded)[:, : 50 * HOP]), step
    assert len(backend.captured) == 1
