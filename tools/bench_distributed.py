"""`rewrite-bench` under ``torchrun --nproc-per-node N`` (WORLD_SIZE > 1): one GPU against N, in one run.

``bench.main`` hands the run here when torchrun started it. Every rank builds the same seeded decoder and
latents (on ``cuda:LOCAL_RANK``, or the CPU) and joins the default process group (``--backend``: nccl on
CUDA, gloo on the CPU, by default). Then:

1. one GPU: rank 0 alone runs the levels of ``--levels`` (which must include ``lossless``) exactly as the
   single-process bench does (`bench.bench_levels`: warm-up, first call, best of ``--repeat``), while the
   other ranks wait. The baseline is rank 0 alone, not every rank on its own device at once: the GPU
   measured has the host to itself, as a one-GPU user's has; the other GPUs sit idle in the wait;
2. N GPUs: every rank calls `rewrite.models.wan.distributed.decode_sharded(vae, z, output="rank0")` on the decoder
   optimized at ``lossless`` (the call ``vae.decode`` makes after ``optimize(vae, "lossless", group=...)``),
   each call timed on rank 0 from a barrier to the whole video on rank 0; the same warm-up and repeats;
3. rank 0 checks the sharded video against its one-GPU ``lossless`` one (``torch.equal``, max-abs, PSNR),
   prints the table and writes ``--json`` (a row ``lossless xN`` among the levels, and a ``distributed``
   entry: world size, backend, the decode mode and the gathered ops, both times, the ratio). Other ranks
   print nothing.

On one machine with one GPU (or the CPU) the ranks share it, so the ratio measures nothing but overhead;
it is written all the same. The Wan models only (the AuK decoder has no sharded decode).
"""

from __future__ import annotations

import datetime
import gc
import os
import sys

import torch
import torch.distributed as dist

BACKENDS = ("nccl", "gloo")
#: `decode_sharded`'s cuda_graphs= (`rewrite.models.wan.distributed.band_graphs.CUDA_GRAPH_MODES`, not imported here: the
#: single-process bench loads no distributed code)
CUDA_GRAPH_MODES = ("segments", "whole", "off")

#: how the one-GPU baseline is measured (written to the JSON)
BASELINE = "rank 0 alone, one process, no group (the other ranks wait idle)"

#: how long a rank waits on another (rank 0's whole baseline included) before the group gives up
TIMEOUT = datetime.timedelta(minutes=30)


def under_torchrun() -> bool:
    """Whether torchrun (or another launcher setting WORLD_SIZE) started more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def check_args(parser, args) -> None:
    """The arguments a run under torchrun needs (exit 2 with the usage otherwise); called by `parse_args`."""
    for flag, value in (("--backend", args.backend), ("--band-cuda-graphs", args.band_cuda_graphs)):
        if value is not None and not under_torchrun():
            parser.error(f"{flag} is for runs under torchrun --nproc-per-node N (WORLD_SIZE > 1)")
    if not under_torchrun():
        return
    if args.model == "auk":
        parser.error("under torchrun the bench runs the sharded Wan decode: --model wan2.1 or wan2.2")
    if "lossless" not in args.levels:
        parser.error("under torchrun --levels must include lossless (the one-GPU baseline of the sharded decode)")
    if args.backend == "nccl" and torch.device(args.device).type != "cuda":
        parser.error("--backend nccl needs --device cuda")


def _device(args) -> torch.device:
    """The CPU, or ``cuda:LOCAL_RANK`` for ``--device cuda`` (any index given is ignored: one GPU per rank;
    with fewer GPUs than local ranks, as two gloo ranks on one GPU, the ranks take them in turn)."""
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    return device


def _barrier(device: torch.device) -> None:
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def _agree(error: BaseException | None) -> None:
    """Rank 0's news after its baseline: every other rank raises with rank 0's error instead of waiting on it."""
    news = [None if error is None else f"{type(error).__name__}: {error}"]
    dist.broadcast_object_list(news, src=0)
    if news[0] is not None and dist.get_rank() != 0:
        raise SystemExit(f"rewrite-bench: rank 0 failed in the one-GPU baseline: {news[0]}")


def run_distributed(args, bench) -> dict | None:
    """The run of the module docstring, `bench` being the `rewrite.tools.bench` module (passed in: this module
    does not import it); the summary on rank 0, None on the other ranks."""
    device, dtype = _device(args), bench.DTYPES[args.dtype]
    backend = args.backend or ("nccl" if device.type == "cuda" else "gloo")
    dist.init_process_group(backend, timeout=TIMEOUT, **({"device_id": device} if backend == "nccl" else {}))
    adapter = None
    try:
        adapter = bench.build_bench(args, device, dtype)  # the same seeded weights and latents on every rank
        (case,) = adapter.cases()
        one_gpu, lossless, error = None, None, None
        if dist.get_rank() == 0:
            try:
                one_gpu, lossless = _one_gpu(adapter, case, args, device, dtype, bench)
            except Exception as caught:  # noqa: BLE001 - told to the other ranks first, then raised
                error = caught
        _agree(error)
        if error is not None:
            raise error
        sharded = _sharded(adapter, case.z, args, device, bench)
        summary = None
        if dist.get_rank() == 0:
            try:
                one_gpu["distributed"] = _compare(adapter, one_gpu["levels"], sharded, lossless, backend, bench)
                head = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                        "torch": torch.__version__, "triton": bench._triton_version(),
                        "model_seed": bench.MODEL_SEED}
                summary = adapter.summary(head, [one_gpu])
            except Exception as caught:  # noqa: BLE001 - raised after the barrier below
                error = caught
        # the ranks tear their group down together: once (gloo, CPU, session 15) rank 1, having destroyed its
        # group while rank 0 was still comparing, aborted at exit ("terminate called without an active
        # exception")
        _barrier(device)
        if error is not None:
            raise error
        return summary
    finally:
        # The module, its runner and their band graphs reference the group through a cycle (module <-> runner):
        # freed here, while the group lives, not at interpreter exit. A group object left to exit tore down its
        # gloo threads during shutdown and aborted the rank ("terminate called without an active exception":
        # sessions 15 and 24, on a loaded CPU).
        adapter = None
        gc.collect()
        dist.destroy_process_group()


def _one_gpu(adapter, case, args, device, dtype, bench):
    """Rank 0 alone: the levels as the single-process bench times them, and the `lossless` video."""
    from tqdm.auto import tqdm

    from rewrite import optimize

    progress = tqdm(total=len(args.levels) * (1 + args.warmup + args.repeat), desc="one GPU", file=sys.stderr)
    with torch.no_grad():
        entry = bench.bench_levels(adapter, case, args, device, dtype, progress)
        optimize(adapter.vae, "lossless")  # the baseline's runner, its graphs captured: no capture
        lossless = adapter.decode(case.z).cpu()  # off the device: not in the sharded decode's peak memory
    progress.close()
    return entry, lossless


def _sharded(adapter, z, args, device, bench) -> dict:
    """Every rank: the sharded decode of the `lossless` module, first call (its per-shape checks included),
    warm-up and timed calls, each from a barrier to the video on rank 0 (rank 0's clock); the peak memory of
    every rank."""
    from rewrite import optimize
    from rewrite.models.wan.distributed import decode_sharded

    vae, cuda_graphs = adapter.vae, args.band_cuda_graphs or "segments"
    optimize(vae, "lossless")  # what a single-process fallback or the tiled mode of the sharded decode runs
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    times, infos = [], []
    with torch.no_grad():
        for _ in range(1 + args.warmup + args.repeat):
            _barrier(device)
            (video, info), seconds = bench._timed(lambda: decode_sharded(vae, z, output="rank0", return_info=True,
                                                                         cuda_graphs=cuda_graphs), device)
            times.append(seconds)
            infos.append(info)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    peaks = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    return {"video": video, "info": info, "first": infos[0], "first_s": times[0], "times_s": times[1 + args.warmup:],
            "peaks": peaks, "cuda_graphs": cuda_graphs}


def _compare(adapter, levels: list, sharded: dict, lossless: torch.Tensor, backend: str, bench) -> dict:
    """Rank 0: the sharded row appended to `levels` (exactness against the one-GPU `lossless` video, speedup
    against the first level as every row's), and the `distributed` entry of the JSON."""
    info, world = sharded["info"], dist.get_world_size()
    peaks = [p for p in sharded["peaks"] if p == p]  # NaN on the CPU
    path = f"sharded: {info.mode}" + (f" ({info.reason})" if info.reason else "")
    if info.mode == "bands":
        path += (f" through band graphs ({info.graph_gathered_convs} conv calls gathered)" if info.graph_steps
                 else f" eagerly ({info.graph_reason})")
    result = bench.LevelResult(f"lossless x{world}", sharded["first_s"], None, min(sharded["times_s"]),
                               sharded["times_s"], max(peaks) if peaks else float("nan"), path=path)
    result.bit_identical, result.max_abs, result.quality_db = adapter.compare(sharded["video"].cpu(), lossless)
    result.speedup = levels[0]["best_s"] / result.best_s
    levels.append(result.to_json(adapter.quality_key))
    one = next(r for r in levels if r["level"] == "lossless")["best_s"]
    return {
        "world_size": world, "backend": backend, "output": "rank0", "verify": True, "baseline": BASELINE,
        "one_gpu_lossless_s": one, "sharded_s": result.best_s, "speedup_vs_one_gpu": one / result.best_s,
        "bit_identical": result.bit_identical, "mode": info.mode, "reason": info.reason,
        "latent_rows": info.latent_rows, "band_local_ops": info.band_local_ops, "gathered_ops": info.gathered_ops,
        "checks_first_call": sharded["first"].checks_run,
        "gathered_reasons": list(sharded["first"].gathered_reasons),  # listed by the call that agreed on them
        "band_cuda_graphs": sharded["cuda_graphs"], "band_graph_replays": info.graph_replays,
        "band_graph_steps": info.graph_steps, "band_graph_checks_first_call": sharded["first"].graph_checks,
        "band_graph_reason": info.graph_reason or sharded["first"].graph_reason,
        "band_graph_gathered_convs": info.graph_gathered_convs,
        "peak_gib_per_rank": sharded["peaks"],
        "cpu_threads_per_rank": torch.get_num_threads(),
    }
