"""Full-size AuK decoder on CUDA through the runtime: exact-length graphs, buckets, tiles, streaming.

Tolerances: ``channels_last`` pads clips to a bucket (the last samples see decoded pad frames instead of
the activations' replicate padding at the clip end) and uses the fused alias-free activation (its own
summation order, see `rewrite.models.auk.alias_free`): the issue's contract is SNR >= 70 dB against eager. Tiled
against whole at the same level differs only by rounding (the halo is the exact decode context), bounded
by the issue at max-abs 1e-4 on the [-1, 1] waveform.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rewrite import optimize, report, warmup
from rewrite.models.auk.capture import reference_decode
from rewrite.models.auk.model import AuKVAE

pytestmark = pytest.mark.gpu


def _snr_db(signal: torch.Tensor, reference: torch.Tensor) -> float:
    noise = (signal.double() - reference.double()).pow(2).sum().item()
    power = reference.double().pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(power / noise)


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    return AuKVAE().cuda().eval()


def latents(batch, frames, seed=1):
    return torch.randn(batch, frames, 64, generator=torch.Generator().manual_seed(seed)).cuda()


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lossless_graphs_are_bit_identical_across_retirement(vae, dtype):
    model = copy.deepcopy(vae).to(dtype)
    optimized = optimize(copy.deepcopy(model), "lossless", max_graphs=2)
    outputs = {}
    for frames in (100, 250, 333, 250, 100):
        z = latents(1, frames, seed=frames).to(dtype)
        out = optimized.decode(z)
        assert report(optimized).last_detail == f"CUDA graph, exact length {frames}"
        assert torch.equal(out, reference_decode(model, z)), frames
        outputs.setdefault(frames, out)
    runner = optimized._rewrite_runner
    assert runner.exact_graphs.generation >= 2 and not runner.capture_failures
    for frames, out in outputs.items():  # copies: untouched by the later replays
        assert torch.equal(out, reference_decode(model, latents(1, frames, seed=frames).to(dtype)))
    z = latents(2, 120).to(dtype)
    assert torch.equal(optimized.decode(z), reference_decode(model, z))


@torch.no_grad()
def test_channels_last_buckets_tiles_and_streaming(vae):
    optimized = optimize(copy.deepcopy(vae), "channels_last")
    warmup(optimized)
    assert report(optimized).cuda_graphs["bucket graphs"] == 3
    z = latents(1, 250)
    out = optimized.decode(z)
    assert report(optimized).last_detail == "CUDA graph, bucket 320 (250 frames padded)"
    snr = _snr_db(out, reference_decode(vae, z))
    print(f"5 s clip, bucket 320: SNR {snr:.1f} dB")
    assert snr >= 70

    long = latents(1, 3000, seed=2)
    tiled = optimized.decode(long)
    assert "tiled windows" in report(optimized).last_detail
    whole_runner = optimize(copy.deepcopy(vae), "channels_last", tile_frames=4000)
    whole = whole_runner.decode(long)
    assert report(whole_runner).last_detail == "CUDA graph, exact length 3000"
    max_abs = (tiled - whole).abs().max().item()
    print(f"60 s clip: tiled vs whole max-abs {max_abs:.3g}, SNR vs eager {_snr_db(tiled, reference_decode(vae, long)):.1f} dB")
    # The issue's bound (1e-4) is asserted by test_tiled_vs_whole_meets_the_issue_bound on other latents; this
    # one is a looser regression bound for this clip (9.8e-5 measured on an H200, torch 2.11, with the Triton
    # convs; 1.01e-4 to 1.06e-4 before them). What remains is the cuDNN convs (the undilated K >= 7 ones, the
    # transposed convs and conv_pre) picking other kernels for other lengths, amplified to TF32's noise floor.
    assert max_abs <= 2e-4

    pieces = list(optimized.decode_tiles(long))
    starts = [start for start, _ in pieces]
    assert starts == sorted(starts) and starts[0] == 0 and len(pieces) > 1
    streamed = torch.cat([piece for _, piece in pieces], dim=1)
    # Streaming replays each window alone (batch 1), `decode` stacks equal-width windows (batch 5 here): the
    # convolutions pick other algorithms per batch, so the two differ at the TF32 noise floor (1.09e-4
    # measured on an H200, torch 2.11): the same regression bound as tiled vs whole.
    assert streamed.shape == tiled.shape and (streamed - tiled).abs().max().item() <= 2e-4
    assert torch.equal(out, optimized.decode(z))  # the copy survived later replays; a replay is deterministic


@torch.no_grad()
def test_tiled_vs_whole_meets_the_issue_bound(vae):
    """The issue's bound. Passed on an H200 (torch 2.11) once the Triton convs, whose per-sample reduction order
    does not depend on the window, replaced most cuDNN convs (it failed at 1.01e-4 to 1.06e-4 before); the
    margin is small, because the remaining cuDNN convs still choose kernels by length."""
    long = latents(1, 3000, seed=2)
    tiled = optimize(copy.deepcopy(vae), "channels_last").decode(long)
    whole = optimize(copy.deepcopy(vae), "channels_last", tile_frames=4000).decode(long)
    assert (tiled - whole).abs().max().item() <= 1e-4


@torch.no_grad()
def test_in_place_weight_updates_after_capture_are_seen_by_the_packed_triton_convs(vae):
    """The Triton convs read weights the runner packed before the capture (`PackedWeightCache`), not the
    parameters: an in-place update after the capture must be re-packed before the next replay."""
    model = copy.deepcopy(vae)
    optimized = optimize(model, "channels_last")
    z = latents(1, 320, seed=3)
    optimized.decode(z)
    assert len(optimized._rewrite_runner.packed_weights) > 0  # the graph's Triton convs read cached packs
    for block in model.decoder.resblocks:
        block.convs1[1].weight.mul_(-0.5)  # dilated convs: Triton-run at every stage width
    out = optimized.decode(z)
    assert report(optimized).last_detail == "CUDA graph, bucket 320"
    assert _snr_db(out, reference_decode(model, z)) >= 70


@torch.no_grad()
def test_skipping_the_padded_tail_changes_no_kept_sample(vae):
    """At channels_last the bucket graphs' Triton kernels skip positions past the clip end plus the decode's
    right context (`rewrite.kernels.valid_length`): the kept samples must be torch.equal to the same graph run
    eagerly on the padded window, which computes the whole bucket. Replays of other content first leave
    different stale values in the skipped positions, so a margin too small would show."""
    optimized = optimize(copy.deepcopy(vae), "channels_last")
    runner = optimized._rewrite_runner
    hop = vae.config.hop_length
    optimized.decode(latents(1, 320, seed=7) * 3)
    optimized.decode(latents(1, 160, seed=8) * 3)
    for frames in (250, 161, 319, 100, 9):
        z = latents(1, frames, seed=frames)
        got = optimized.decode(z)
        width = next(b for b in runner.compile_shapes if b >= frames)
        padded = torch.cat([z, runner.pad_latent().expand(1, width - frames, -1)], dim=1)
        expected = runner.run_window(padded)[:, : frames * hop]
        assert torch.equal(got, expected), frames


#: AuK `channels_last` in half precision (issue 37): no further from the fp32 eager decode than the eager decode
#: in that dtype is, minus this many dB of SNR (measured before: bf16 channels_last 45.6 dB against fp32 where
#: bf16 eager is 44.5 dB)
HALF_PRECISION_MARGIN_DB = 1.0


@torch.no_grad()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_channels_last_in_half_precision_is_as_close_to_fp32_as_eager_is(vae, dtype):
    z = latents(1, 250)
    fp32 = reference_decode(vae, z)
    model = copy.deepcopy(vae).to(dtype)
    eager = reference_decode(model, z.to(dtype))
    optimized = optimize(copy.deepcopy(model), "channels_last")
    fast = optimized.decode(z.to(dtype))
    eager_snr, fast_snr = _snr_db(eager.float(), fp32), _snr_db(fast.float(), fp32)
    print(f"5 s clip {dtype}: eager {eager_snr:.1f} dB, channels_last {fast_snr:.1f} dB against fp32 eager; "
          f"channels_last {_snr_db(fast.float(), eager.float()):.1f} dB against eager in {dtype}")
    assert report(optimized).last_path == "graphs"
    assert fast_snr >= eager_snr - HALF_PRECISION_MARGIN_DB
