"""`rewrite-bench`: decode seeded latents with a random-init full-size decoder at several levels, side by side.

For each level (one model, one set of weights, levels switched with `optimize`): the first call (capture
included), then best of N timed calls after warm-up, peak memory, and the output against level `off`
(`torch.equal`, max-abs, PSNR over the [-1, 1] output range). Ratios are computed within this one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclasses.dataclass
class LevelResult:
    level: str
    first_call_s: float
    best_s: float
    times_s: list[float]
    peak_gib: float
    bit_identical: bool | None = None
    max_abs: float | None = None
    psnr_db: float | None = None
    path: str = ""
    speedup: float | None = None


def parse_args(argv):
    from rewrite.levels import LEVELS
    from rewrite.models.wan import SIZES, WAN_VERSIONS

    parser = argparse.ArgumentParser(prog="rewrite-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=WAN_VERSIONS, default="wan2.1")
    parser.add_argument("--config", choices=SIZES, default="full")
    parser.add_argument("--size", default="480x832", help="output HxW in pixels (default 480x832)")
    parser.add_argument("--frames", type=int, default=81, help="output frames, 1 + 4k (default 81)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--levels", default="off,lossless", help=f"comma-separated, from {', '.join(LEVELS)}")
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per level (best is reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls after the first call")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-' for stdout)")
    parser.add_argument("--profile", action="store_true", help="per-kernel table of one call per level")
    args = parser.parse_args(argv)
    args.levels = [level.strip() for level in args.levels.split(",") if level.strip()]
    for level in args.levels:
        if level not in LEVELS:
            parser.error(f"unknown level {level!r} in --levels; expected from {', '.join(LEVELS)}")
    try:
        args.height, args.width = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size must look like 480x832, got {args.size!r}")
    if args.frames < 1 or (args.frames - 1) % 4:
        parser.error(f"--frames must be 1 + 4k (Wan's temporal factor), got {args.frames}")
    if args.repeat < 1 or args.warmup < 0 or args.batch < 1:
        parser.error("--repeat and --batch must be >= 1, --warmup >= 0")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device):
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - start


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float, float]:
    """torch.equal, max-abs difference and PSNR (peak-to-peak 2: outputs are clamped to [-1, 1])."""
    diff = out.float() - ref.float()
    mse = diff.pow(2).mean().item()
    psnr = math.inf if mse == 0 else 10 * math.log10(4.0 / mse)
    return torch.equal(out, ref), diff.abs().max().item(), psnr


def profile_table(fn, device, rows: int = 15) -> str:
    """Top kernels of one call and the convolution share of device time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    events = prof.key_averages()
    use_device = device.type == "cuda"

    def self_time(e):
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) if use_device else e.self_cpu_time_total

    total = sum(self_time(e) for e in events) or 1
    conv_words = ("conv", "implicit_gemm", "sm90_xmma", "cudnn", "wgrad", "dgrad", "fprop")
    conv = sum(self_time(e) for e in events if any(w in e.key.lower() for w in conv_words))
    table = events.table(sort_by="self_cuda_time_total" if use_device else "self_cpu_time_total", row_limit=rows)
    return f"{table}\nconvolution share of {'device' if use_device else 'CPU'} self time: {100 * conv / total:.1f}%"


def run(args) -> dict:
    from tqdm.auto import tqdm

    from rewrite import optimize, report
    from rewrite.models.wan import build_wan

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    vae = build_wan(args.model, args.config).to(device=device, dtype=dtype)
    ratio = vae.spatial_compression_ratio
    if args.height % ratio or args.width % ratio:
        raise SystemExit(f"rewrite-bench: --size must be a multiple of {ratio} for {args.model}")
    shape = (args.batch, vae.config.z_dim, 1 + (args.frames - 1) // 4, args.height // ratio, args.width // ratio)
    z = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    results, reference, profiles = [], None, {}
    progress = tqdm(total=len(args.levels) * (1 + args.warmup + args.repeat), desc="decodes", file=sys.stderr)
    with torch.no_grad():
        for level in args.levels:
            optimize(vae, level=level)
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            decode = lambda: vae.decode(z).sample  # noqa: E731
            out, first = _timed(decode, device)
            progress.update()
            for _ in range(args.warmup):
                _timed(decode, device)
                progress.update()
            times = []
            for _ in range(args.repeat):
                out, seconds = _timed(decode, device)
                times.append(seconds)
                progress.update()
            peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
            result = LevelResult(level, first, min(times), times, peak, path=report(vae).last_path)
            if reference is None:
                reference = out.clone()
            else:
                result.bit_identical, result.max_abs, result.psnr_db = compare(out, reference)
            result.speedup = results[0].best_s / result.best_s if results else 1.0
            results.append(result)
            if args.profile:
                profiles[level] = profile_table(decode, device)
    progress.close()
    return {
        "model": args.model, "config": args.config, "size": f"{args.height}x{args.width}", "frames": args.frames,
        "batch": args.batch, "dtype": args.dtype, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "triton": _triton_version(), "latents": list(shape),
        "levels": [dataclasses.asdict(r) for r in results], "profiles": profiles,
    }


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def format_table(summary: dict) -> str:
    head = (f"{summary['model']} {summary['config']} {summary['size']}x{summary['frames']} {summary['dtype']} "
            f"on {summary['device']} (torch {summary['torch']}, triton {summary['triton']})")
    lines = [head, f"{'level':<14}{'first s':>9}{'best s':>9}{'speedup':>9}{'peak GiB':>10}{'equal':>7}{'max abs':>10}{'PSNR dB':>9}  path"]
    for r in summary["levels"]:
        equal = "ref" if r["bit_identical"] is None else str(r["bit_identical"])
        max_abs = "" if r["max_abs"] is None else f"{r['max_abs']:.3g}"
        psnr = "" if r["psnr_db"] is None else ("inf" if math.isinf(r["psnr_db"]) else f"{r['psnr_db']:.1f}")
        lines.append(f"{r['level']:<14}{r['first_call_s']:>9.3f}{r['best_s']:>9.3f}{r['speedup']:>8.2f}x"
                     f"{r['peak_gib']:>10.2f}{equal:>7}{max_abs:>10}{psnr:>9}  {r['path']}")
    for level, table in summary["profiles"].items():
        lines += ["", f"profile at level {level}:", table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = run(args)
    print(format_table(summary))
    if args.json:
        text = json.dumps(summary, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as handle:
                handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
