"""`decode_sharded`: one Wan decode spread over the ranks of a process group, bit-identical to one process.

Modes (chosen per call, the same on every rank):

* bands (the default): each rank decodes latent rows [a, b) of every frame (`rewrite.models.wan.distributed.bands`):
  halo rows before each spatial conv, the middle block's attention on its gathered input, the causal caches
  of the band only. For a module `rewrite.optimize` optimized, through the rewritten band graphs where they
  were seen to agree with that eager band form (`rewrite.models.wan.distributed.band_graphs`). `post_quant_conv` (a
  1x1x1 conv of the latents, which every rank holds) runs on the whole latent on every rank, as in
  diffusers' `_decode`.
* tiles: where diffusers would tile (`vae.enable_tiling()` and a latent larger than one tile), tile n of
  diffusers' row-major order is decoded on rank n % world by the module's own decoder (optimized or not);
  the tiles are all-gathered and blended with diffusers' `blend_v`/`blend_h` in diffusers' order.
* single-process: where bands cannot serve (a guard of `rewrite.runtime.guards` objects: autograd, hooks,
  train-mode dropout, mixed dtypes; a module without a band form; a band of fewer than `MIN_BAND_ROWS` = 2
  latent rows) every rank runs `vae.decode(z)` itself; the reason is logged on the ``rewrite`` logger and
  in `ShardedInfo`.

`enable_slicing()` is followed as diffusers follows it (a batch over 1 is decoded one sample at a time).
"""

from __future__ import annotations

import dataclasses
import logging
import zlib

import torch
from torch import nn

from rewrite.models.wan.distributed.bands import (
    MIN_BAND_ROWS,
    BandRun,
    band_decoder,
    cache_slots,
    diffusers_wan,
    forget_verdicts,
    split_rows,
)
from rewrite.models.wan.distributed.band_graphs import CUDA_GRAPH_MODES
from rewrite.models.wan.distributed.comm import Comm, DistributedDecodeError, resolve_group
from rewrite.runtime import guards
from rewrite.runtime.locks import CAPTURE_GATE

logger = logging.getLogger("rewrite.models.wan.distributed")

OUTPUTS = ("all", "rank0", "band")


class ShardMismatchError(ValueError):
    """The ranks were given different latents, weights, settings or options; the message names them."""


@dataclasses.dataclass
class ShardedInfo:
    """What one `decode_sharded` call did on this rank."""

    mode: str                              # "bands", "tiles" or "single-process"
    reason: str | None = None              # why single-process
    latent_rows: list | None = None        # bands: latent rows [start, stop) per rank
    output_rows: list | None = None        # output video rows [start, stop) per rank (bands and "band")
    band_local_ops: int = 0                # bands: op calls run on the band
    gathered_ops: int = 0                  # bands: op calls run on the gathered tensor (attention included)
    checks_run: int = 0                    # bands: per-shape checks this call ran (the rest were cached)
    gathered_reasons: list = dataclasses.field(default_factory=list)
    graph_steps: int = 0                   # bands: steps run through the rewritten band graphs
    graph_replays: int = 0                 # bands: of those, replayed from their CUDA-graph segments
    graph_checks: int = 0                  # bands: of those, steps checked (graphs against the eager band
    #                                        mode, segments against the graphs)
    graph_reason: str | None = None        # bands: why the band graphs did not serve (some) steps
    graph_gathered_convs: int = 0          # bands: conv calls the band graphs run on the gathered whole
    #                                        tensor (their band form failed its check on some rank)
    tiles: list | None = None              # tiles: tile origins (latent row, col) this rank decoded


def output_rows(vae: nn.Module, latent_height: int, world: int) -> list[tuple[int, int]]:
    """The output video rows [start, stop) that each rank's band covers (what `output="band"` returns)."""
    ratio = vae.config.scale_factor_spatial
    return [(a * ratio, b * ratio) for a, b in split_rows(latent_height, world)]


def decode_sharded(vae: nn.Module, z: torch.Tensor, *, group=None, output: str = "all", verify: bool = True,
                   timeout=None, return_info: bool = False, cuda_graphs: str = "segments"):
    """Decode Wan latents `z` [batch, z_dim, frames, height, width] across the ranks of `group`.

    Collective: every rank of `group` (a ProcessGroup, a 1-D DeviceMesh, or None for the default group)
    calls it with the same latents, weights and options, each on its own device (or all on one). `vae`: a
    diffusers `AutoencoderKLWan`, optimized by `rewrite.optimize` or not (the band mode runs an optimized
    module's bands through rewritten band graphs, `rewrite.models.wan.distributed.band_graphs`, and otherwise diffusers'
    modules on a private copy of the decoder; the live module is never changed, also on error).

    Returns the video [batch, channels, frames, H, W] clamped as `vae.decode(z).sample` is:
    `output="all"` on every rank; `"rank0"` on group rank 0 (None elsewhere); `"band"` this rank's rows
    `output_rows(vae, height, world)[rank]` of it. With `return_info=True`, `(video, ShardedInfo)`.

    Exactness class: `torch.equal` to this process's single-process `vae.decode(z).sample` under the same
    backend settings (device kind, CPU thread count, cuDNN flags): so to diffusers, and to the `lossless`
    decode. Each band-local conv, norm and SiLU is admitted per shape by a check against the whole op (see
    `rewrite.models.wan.distributed.bands`); where one fails, that op runs on the gathered tensor. The tiled mode is
    `torch.equal` to the single-process tiled decode.

    Preconditions and failures: latents of the wrong rank or channel count raise `ValueError`; with
    `verify` (default) the ranks first compare cheap integer checksums of the latents and of every decoder
    and `post_quant_conv` tensor (plus shapes, dtypes, config and options) and raise `ShardMismatchError`
    on every rank naming what differs on which rank. A rank whose code raises posts its error to the
    group's store; the others raise `PeerFailedError` naming it as soon as their collective fails (at once
    where the failing process exits, else within `timeout` (seconds or a timedelta, per collective wait;
    default the process group's own timeout); a collective that fails without a posted cause raises
    `CollectiveError`. After either the group has unfinished operations: destroy it.

    `cuda_graphs` (an optimized module's band graphs on CUDA): "segments" (default: replayed from CUDA graphs
    captured between the collectives), "whole" (each step one CUDA graph with its collectives inside: NCCL
    only; with gloo the graphs run op by op, logged) or "off" (op by op); another value raises `ValueError`.
    """
    if output not in OUTPUTS:
        raise ValueError(f"decode_sharded: output must be one of {', '.join(OUTPUTS)}; got {output!r}")
    if cuda_graphs not in CUDA_GRAPH_MODES:
        raise ValueError(f"decode_sharded: cuda_graphs must be one of {', '.join(CUDA_GRAPH_MODES)}; "
                         f"got {cuda_graphs!r}")
    comm = Comm(resolve_group(group), timeout)
    try:
        video, info = _decode(vae, z, comm, output, verify, cuda_graphs)
    except DistributedDecodeError:
        forget_verdicts(comm)
        raise
    except Exception as error:
        comm.post_error(error)
        forget_verdicts(comm)
        raise
    return (video, info) if return_info else video


def _check_inputs(vae, z) -> None:
    if not isinstance(vae, diffusers_wan().AutoencoderKLWan):
        raise TypeError(f"decode_sharded expects a diffusers AutoencoderKLWan; got {type(vae).__name__}")
    if not isinstance(z, torch.Tensor) or z.dim() != 5 or z.shape[1] != vae.config.z_dim or z.shape[2] < 1:
        shape = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise ValueError(f"decode_sharded: latents must be [batch, {vae.config.z_dim}, frames >= 1, height, width]; "
                         f"got {shape}")


def _decode(vae, z, comm: Comm, output: str, verify: bool, cuda_graphs: str = "segments"):
    _check_inputs(vae, z)
    if verify:
        _verify(vae, z, comm, output)
    tiled = _tiles_apply(vae, z)
    reason = _single_process_reason(vae, z, comm, tiled)
    run = None
    if reason is None and not tiled:
        run = BandRun(comm, split_rows(z.shape[3], comm.world))
        decoder, reason = band_decoder(vae.decoder, run)
    ok = comm.all_reduce_min(int(reason is None), "the choice of the decode mode")
    if not ok:
        reason = reason or "another rank cannot decode this call by bands or tiles"
        logger.warning("single-process decode on every rank: %s", reason)
        video = vae.decode(z).sample
        info = ShardedInfo("single-process", reason)
        if output == "band":
            if z.shape[3] < comm.world:
                raise ValueError(f"decode_sharded: output='band' needs at least {comm.world} latent rows")
            rows = output_rows(vae, z.shape[3], comm.world)
            info.output_rows = rows
            a, b = rows[comm.rank]
            video = video[..., a:b, :]
        elif output == "rank0" and comm.rank != 0:
            video = None
        return video, info
    slices = z.split(1) if vae.use_slicing and z.shape[0] > 1 else [z]
    if tiled:
        info = ShardedInfo("tiles", tiles=[])
        parts = [_tiled_decode(vae, s, comm, output, info) for s in slices]
        if output == "rank0" and comm.rank != 0:
            return None, info
        video = torch.cat(parts) if len(parts) > 1 else parts[0]
        if output == "band":
            info.output_rows = output_rows(vae, z.shape[3], comm.world)
            a, b = info.output_rows[comm.rank]
            video = video[..., a:b, :]
        return video, info
    with torch.no_grad(), CAPTURE_GATE.running():
        runner = _band_graph_runner(vae)
        graph_stats: dict = {}
        bands = [_band_decode(vae, decoder, run, s, runner, graph_stats, cuda_graphs) for s in slices]
        band = torch.cat(bands) if len(bands) > 1 else bands[0]
        info = ShardedInfo("bands", latent_rows=run.rows, band_local_ops=run.stats.local,
                           gathered_ops=run.stats.gathered, checks_run=run.stats.checks,
                           gathered_reasons=list(run.stats.reasons), graph_steps=graph_stats.get("graph_steps", 0),
                           graph_replays=graph_stats.get("replayed_steps", 0),
                           graph_checks=graph_stats.get("checked_steps", 0), graph_reason=graph_stats.get("reason"),
                           graph_gathered_convs=graph_stats.get("gathered_convs", 0))
        s = run.scale(band.shape[-2])
        info.output_rows = run.rows_at(s)
        if output == "band":
            return band, info
        heights = [b - a for a, b in info.output_rows]
        video = comm.gather_rows(band, heights, "the gather of the output video",
                                 to=None if output == "all" else 0)
    return video, info


def _band_graph_runner(vae):
    """The Wan runner `rewrite.optimize` installed on `vae` (its pass pipeline rewrites the band graphs), or None."""
    from rewrite.runtime.runner import installed_runner

    runner = installed_runner(vae)
    return runner if runner is not None and getattr(runner, "model_name", None) == "wan" else None


def _band_decode(vae, decoder, run: BandRun, z: torch.Tensor, runner=None, graph_stats=None,
                 cuda_graphs: str = "segments") -> torch.Tensor:
    """This rank's band of the clamped video: through the rewritten band graphs where they serve
    (`rewrite.models.wan.distributed.band_graphs`), else diffusers' `_decode` frame loop over the band decoder."""
    from rewrite.models.wan.capture import reference_forward
    from rewrite.models.wan.distributed.band_graphs import decode_band_graphs
    from rewrite.models.wan.frames import finish_video, store_frames, temporal_factor

    graph_stats = {} if graph_stats is None else graph_stats
    video = decode_band_graphs(vae, decoder, run, z, runner, graph_stats, cuda_graphs)
    if video is not None:
        return video
    x = run.own(vae.post_quant_conv(z))
    cache: list = [None] * cache_slots(decoder)
    frames, temporal = x.shape[2], temporal_factor(vae.decoder)
    out = None
    for i in range(frames):
        frame = reference_forward(decoder, x[:, :, i:i + 1], feat_cache=cache, feat_idx=[0], first_chunk=i == 0)
        out = store_frames(out, frame, i, frames, temporal)
    return finish_video(vae, out)


# ---- mode choice ----------------------------------------------------------------------------------------
def _tiles_apply(vae, z) -> bool:
    """Whether diffusers' `_decode` would run `tiled_decode` for `z`."""
    ratio = vae.spatial_compression_ratio
    return bool(vae.use_tiling and (z.shape[4] > vae.tile_sample_min_width // ratio
                                    or z.shape[3] > vae.tile_sample_min_height // ratio))


def _single_process_reason(vae, z, comm: Comm, tiled: bool) -> str | None:
    decoder = vae.decoder
    allowed = decoder.__dict__.get("forward") if "_rewrite_runner" in decoder.__dict__ else None
    listing = list(decoder.named_modules(prefix="decoder"))
    reasons = [
        guards.autograd_reason(vae, z),
        None if tiled else guards.hook_reason(decoder, "decoder", allowed_forward=allowed, modules=listing),
        None if tiled else guards.hook_reason(vae.post_quant_conv, "post_quant_conv"),
        "an accelerate hook (_hf_hook) on the VAE" if getattr(vae, "_hf_hook", None) is not None else None,
        guards.uniform_parameters_reason(decoder, z),
        None if tiled else guards.training_reason(listing),
        None if tiled or z.shape[3] >= MIN_BAND_ROWS * comm.world else
        f"{z.shape[3]} latent rows cannot be split into {comm.world} bands of {MIN_BAND_ROWS} rows or more",
    ]
    return next((r for r in reasons if r is not None), None)


# ---- tiles ----------------------------------------------------------------------------------------------
def _tiled_decode(vae, z, comm: Comm, output: str, info: ShardedInfo):
    """diffusers' `AutoencoderKLWan.tiled_decode` (0.42) with tile n decoded on rank n % world; the
    blending is diffusers' own code on every rank (on rank 0 only for output="rank0")."""
    _, _, num_frames, height, width = z.shape
    sample_height = height * vae.spatial_compression_ratio
    sample_width = width * vae.spatial_compression_ratio
    tile_latent_min_height = vae.tile_sample_min_height // vae.spatial_compression_ratio
    tile_latent_min_width = vae.tile_sample_min_width // vae.spatial_compression_ratio
    tile_latent_stride_height = vae.tile_sample_stride_height // vae.spatial_compression_ratio
    tile_latent_stride_width = vae.tile_sample_stride_width // vae.spatial_compression_ratio
    tile_sample_stride_height = vae.tile_sample_stride_height
    tile_sample_stride_width = vae.tile_sample_stride_width
    patch = vae.config.patch_size
    if patch is not None:
        sample_height = sample_height // patch
        sample_width = sample_width // patch
        tile_sample_stride_height = tile_sample_stride_height // patch
        tile_sample_stride_width = tile_sample_stride_width // patch
        blend_height = vae.tile_sample_min_height // patch - tile_sample_stride_height
        blend_width = vae.tile_sample_min_width // patch - tile_sample_stride_width
    else:
        blend_height = vae.tile_sample_min_height - tile_sample_stride_height
        blend_width = vae.tile_sample_min_width - tile_sample_stride_width

    origins = [(i, j) for i in range(0, height, tile_latent_stride_height)
               for j in range(0, width, tile_latent_stride_width)]
    mine = []
    for n, (i, j) in enumerate(origins):
        if n % comm.world != comm.rank:
            continue
        info.tiles.append((i, j))
        feat_cache: list = [None] * vae._cached_conv_counts["decoder"]
        time = []
        for k in range(num_frames):
            tile = z[:, :, k:k + 1, i:i + tile_latent_min_height, j:j + tile_latent_min_width]
            tile = vae.post_quant_conv(tile)
            time.append(vae.decoder(tile, feat_cache=feat_cache, feat_idx=[0], first_chunk=(k == 0)))
        mine.append(torch.cat(time, dim=2))
    like = mine[0] if mine else z
    everyone = comm.gather_objects_of_tensors(mine, like, "the gather of the decoded tiles")
    if output == "rank0" and comm.rank != 0:
        return None
    decoded = {origin: everyone[n % comm.world][n // comm.world] for n, origin in enumerate(origins)}
    rows = [[decoded[(i, j)] for j in range(0, width, tile_latent_stride_width)]
            for i in range(0, height, tile_latent_stride_height)]

    result_rows = []
    for i, row in enumerate(rows):
        result_row = []
        for j, tile in enumerate(row):
            if i > 0:
                tile = vae.blend_v(rows[i - 1][j], tile, blend_height)
            if j > 0:
                tile = vae.blend_h(row[j - 1], tile, blend_width)
            result_row.append(tile[:, :, :, :tile_sample_stride_height, :tile_sample_stride_width])
        result_rows.append(torch.cat(result_row, dim=-1))
    dec = torch.cat(result_rows, dim=3)[:, :, :, :sample_height, :sample_width]
    if patch is not None:
        dec = diffusers_wan().unpatchify(dec, patch_size=patch)
    return torch.clamp(dec, min=-1.0, max=1.0)


# ---- verification ---------------------------------------------------------------------------------------
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _checksum(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two int64 sums of a tensor's bit patterns (plain and position-weighted), exact and order-free
    (integer arithmetic modulo 2**64), so equal tensors give equal sums on any device."""
    flat = t.detach().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    if flat.is_floating_point():
        flat = flat.view(_INT_VIEW[flat.element_size()])
    s1 = torch.zeros((), dtype=torch.int64, device=flat.device)
    s2 = torch.zeros((), dtype=torch.int64, device=flat.device)
    step = 1 << 22
    for start in range(0, flat.numel(), step):
        part = flat[start:start + step].to(torch.int64)
        weight = (torch.arange(start, start + part.numel(), device=flat.device, dtype=torch.int64) % 8191) + 1
        s1 += part.sum()
        s2 += (part * weight).sum()
    return s1, s2


def _code(text: str) -> int:
    return zlib.crc32(text.encode())


def _verify(vae, z, comm: Comm, output: str) -> None:
    """Raise ShardMismatchError on every rank where the ranks' latents, weights, settings or options differ."""
    tensors = [("post_quant_conv." + n, t) for n, t in vae.post_quant_conv.named_parameters()]
    tensors += [("decoder." + n, t) for n, t in vae.decoder.named_parameters()]
    tensors += [("decoder." + n, t) for n, t in vae.decoder.named_buffers()]
    layout = ";".join(f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in tensors)
    config = repr(sorted((k, repr(v)) for k, v in vae.config.items() if not k.startswith("_")))
    tiling = (vae.use_tiling, vae.use_slicing, vae.tile_sample_min_height, vae.tile_sample_min_width,
              vae.tile_sample_stride_height, vae.tile_sample_stride_width)
    fields = [
        ("the output option", [_code(output)]),
        ("the latent shape", list(z.shape) + [0] * (5 - z.dim())),
        ("the latent dtype", [_code(str(z.dtype))]),
        ("the VAE config", [_code(config)]),
        ("the tiling/slicing settings", [int(v) for v in tiling]),
        ("the decoder's parameter names, shapes and dtypes", [len(tensors), _code(layout)]),
    ]
    meta = torch.tensor([v for _, values in fields for v in values], dtype=torch.int64)
    everyone = comm.all_gather_vector(meta, "the check of shapes and options")
    differ, offset = [], 0
    for name, values in fields:
        n = len(values)
        seen = [tuple(int(v) for v in m[offset:offset + n]) for m in everyone]
        if len(set(seen)) > 1:
            differ.append(f"{name} ({_by_rank(seen)})")
        offset += n
    if differ:
        raise ShardMismatchError("decode_sharded: the ranks differ in " + "; ".join(differ))
    sums = [torch.stack(_checksum(z))] + [torch.stack(_checksum(t)) for _, t in tensors]
    mine = torch.stack(sums).cpu().reshape(-1)
    everyone = comm.all_gather_vector(mine, "the checksum of latents and weights")
    names = ["the latents"] + [n for n, _ in tensors]
    bad = []
    for k, name in enumerate(names):
        seen = [tuple(int(v) for v in e[2 * k:2 * k + 2]) for e in everyone]
        if len(set(seen)) > 1:
            ranks = [r for r in range(comm.world) if seen[r] != seen[0]]
            bad.append(f"{name} (rank 0 differs from rank{'s' if len(ranks) > 1 else ''} "
                       f"{', '.join(map(str, ranks))})")
    if bad:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ShardMismatchError(f"decode_sharded: the ranks hold different values (checksums differ): {shown}")


def _by_rank(seen: list[tuple]) -> str:
    return ", ".join(f"rank {r}: {v[0] if len(v) == 1 else v}" for r, v in enumerate(seen))
