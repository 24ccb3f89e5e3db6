"""First-call seconds of an optimized Wan decoder in fresh processes, with empty and warm caches (GPU run).

Usage (on a GPU machine with the project installed; one model per command, about 6-7 min each; the JSON goes
to $OUT, or the current directory without it):

    python -m rewrite.tools.first_call --model wan2.1            # writes $OUT/first_call_wan2.1.json
    python -m rewrite.tools.first_call --model wan2.2
    python -m rewrite.tools.first_call --model wan2.1 --cases cold,disk_cold,disk_warm,warmup   # fewer cases
    python -m rewrite.tools.first_call --device cpu --config tiny --latent 4x6 --other 6x8 --latent-frames 3   # dry run

Each case runs in a new Python process (bf16, lossless, 720x1280, 81 frames = 21 latent frames of 90x160 for Wan 2.1, 45x80 for Wan 2.2):

  cold                   empty Triton cache, no disk cache (what a new container pays today)
  triton_warm            Triton's cache warm (from `cold`), no disk cache (issue 20's case)
  disk_cold              Triton warm, an empty REWRITE cache dir: the first call also writes the entry
  disk_warm              Triton warm, the disk cache from `disk_cold`: export, passes and self-checks skipped;
                         also checks the decode is torch.equal to level "off" (the graphs read back from disk)
  disk_warm_triton_cold  the disk cache warm but an empty Triton cache: what the kernel compiles cost alone
  warmup                 both warm: `warmup(shapes=[(90, 160)], frames=[21])`, then the first decode (should cost
                         what the second one does: no capture, self-check or compile left)
  second_size            both warm: a 720p decode, then the first 480x832 (60x104) decode of the process

Per case the JSON holds: seconds of imports, model build, optimize, first and second decode (CUDA-synchronized),
the report's `first_call` records (graph, stage, seconds) and their total, the disk cache summary, the
self-check counts and seconds of the process (`rewrite.ops.selftest.stats`), and for `warmup` its breakdown.
The file is rewritten after every case, so a timeout keeps what finished.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

#: latent sizes of 720x1280 and 480x832 pixels: Wan 2.1 compresses 8x spatially, Wan 2.2 16x
DEFAULT_LATENTS = {"wan2.1": ("90x160", "60x104"), "wan2.2": ("45x80", "30x52")}
CASES = ("cold", "triton_warm", "disk_cold", "disk_warm", "disk_warm_triton_cold", "warmup", "second_size")


def child(args) -> dict:
    start = time.perf_counter()
    import torch

    import diffusers  # noqa: F401  (12 s on the GPU host: not part of the first call)
    from rewrite import optimize, report, supported, warmup
    from rewrite.ops import selftest

    result: dict = {"case": args.case, "imports_s": time.perf_counter() - start}
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start = time.perf_counter()
    vae = supported.get(args.model).build(args.config, device=device, dtype=torch.bfloat16)
    sync()
    result["build_s"] = time.perf_counter() - start
    cache_dir = args.disk_cache or False
    (h, w), (h2, w2), frames = _size(args.latent), _size(args.other), args.latent_frames

    def timed(fn):
        sync()
        begin = time.perf_counter()
        value = fn()
        sync()
        return value, time.perf_counter() - begin

    def latents(h, w, seed=0):
        g = torch.Generator(device=device).manual_seed(seed)
        return torch.randn(1, vae.config.z_dim, frames, h, w, generator=g, device=device, dtype=torch.bfloat16)

    _, result["optimize_s"] = timed(lambda: optimize(vae, "lossless", cache_dir=cache_dir))
    z = latents(h, w)
    with torch.no_grad():
        if args.case == "warmup":
            warm, result["warmup_s"] = timed(lambda: warmup(vae, shapes=[(h, w)], frames=[frames]))
            result["warmup_breakdown"] = [[t.graph, t.stage, round(t.seconds, 4)] for t in warm.breakdown]
        out, result["first_decode_s"] = timed(lambda: vae.decode(z).sample)
        _, result["second_decode_s"] = timed(lambda: vae.decode(z).sample)
        if args.case == "second_size":
            z2 = latents(h2, w2, seed=1)
            _, result["other_size_first_decode_s"] = timed(lambda: vae.decode(z2).sample)
            _, result["other_size_second_decode_s"] = timed(lambda: vae.decode(z2).sample)
        summary = report(vae)
        result["last_path"] = summary.last_path
        result["first_call"] = [[t.graph, t.stage, round(t.seconds, 4)] for t in summary.first_call]
        result["first_call_total_s"] = summary.first_call_seconds
        result["disk_cache"] = summary.disk_cache
        result["graph_sources"] = {g.name: g.source for g in summary.graphs}
        result["selfchecks"] = selftest.stats()
        result["report"] = str(summary)
        if args.case == "disk_warm":
            optimize(vae, "off")
            reference = vae.decode(z).sample
            result["bit_identical_to_off"] = bool(torch.equal(out, reference))
    if device.type == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def _size(text: str) -> tuple[int, int]:
    h, w = text.split("x")
    return int(h), int(w)


def parent(args) -> None:
    out_dir = os.environ.get("OUT", ".")
    path = os.path.join(out_dir, f"first_call_{args.model}.json")
    work = tempfile.mkdtemp(prefix="first_call_")
    triton_warm, triton_cold2 = os.path.join(work, "triton"), os.path.join(work, "triton_cold2")
    disk = os.path.join(work, "rewrite_cache")
    plan = {
        "cold": (triton_warm, None),  # fills the Triton cache the later cases use
        "triton_warm": (triton_warm, None),
        "disk_cold": (triton_warm, disk),
        "disk_warm": (triton_warm, disk),
        "disk_warm_triton_cold": (triton_cold2, disk),
        "warmup": (triton_warm, disk),
        "second_size": (triton_warm, disk),
    }
    results = {"model": args.model, "size": "720x1280", "frames": 81, "dtype": "bfloat16", "level": "lossless",
               "cases": {}}
    for case in args.cases.split(","):
        if case not in plan:
            raise SystemExit(f"unknown case {case!r}; expected some of {','.join(CASES)}")
        triton_dir, disk_dir = plan[case]
        env = dict(os.environ, TRITON_CACHE_DIR=triton_dir, PYTHONUNBUFFERED="1")
        env.pop("REWRITE_CACHE_DIR", None)
        command = [sys.executable, os.path.abspath(__file__), "--child", "--model", args.model, "--case", case,
                   "--device", args.device, "--config", args.config, "--latent", args.latent, "--other", args.other,
                   "--latent-frames", str(args.latent_frames)]
        if disk_dir:
            command += ["--disk-cache", disk_dir]
        begin = time.perf_counter()
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
        wall = time.perf_counter() - begin
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        entry = json.loads(lines[-1]) if run.returncode == 0 and lines else {"error": run.stderr[-3000:]}
        entry["process_wall_s"] = wall
        results["cases"][case] = entry
        shown = {k: (round(v, 2) if isinstance(v, float) else v) for k, v in entry.items()
                 if k.endswith("_s") or k in ("last_path", "bit_identical_to_off", "error")}
        print(case, json.dumps(shown), flush=True)
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    if args.disk_listing:
        results["disk_cache_files"] = {n: os.path.getsize(os.path.join(disk, n)) for n in sorted(os.listdir(disk))} \
            if os.path.isdir(disk) else {}
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="wan2.1", choices=("wan2.1", "wan2.2"))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--timeout", type=int, default=300, help="seconds per case")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--config", default="full", choices=("full", "tiny"))
    parser.add_argument("--latent", help="latent HxW of the main decode (default: 720x1280 pixels, 90x160 for "
                        "wan2.1, 45x80 for wan2.2)")
    parser.add_argument("--other", help="latent HxW of case second_size's other size (default: 480x832 pixels)")
    parser.add_argument("--latent-frames", type=int, default=21, help="latent frames (21: 81 pixel frames)")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--case")
    parser.add_argument("--disk-cache")
    parser.add_argument("--no-disk-listing", dest="disk_listing", action="store_false")
    args = parser.parse_args()
    main_size, other_size = DEFAULT_LATENTS[args.model]
    args.latent, args.other = args.latent or main_size, args.other or other_size
    if args.child:
        print(json.dumps(child(args)), flush=True)
    else:
        parent(args)


if __name__ == "__main__":
    main()
