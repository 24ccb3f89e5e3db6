"""Decode the sizes and clip lengths users run, per Wan model, at every level, against issue 37's targets.

For each model and size this runs what ``rewrite-bench --model M --size S --frames F --levels L`` runs (one
random-init full-size decoder per model and size, seeded latents, best of ``--repeat`` calls, ratios against
``off`` measured in the same run) and writes one JSON with every bench summary and a verdict per row:
``lossless`` must be bit-identical and at least `TARGETS` times as fast as ``off``, and no level's peak memory
above ``off``'s (``peaks_within_off``; the long clips' target). Needs CUDA for numbers
that mean anything (on a CPU it checks exactness only, as ``rewrite-bench`` does).

    python -m rewrite.tools.sweep_sizes --json docs/data/benchmarks/size_sweep_81_frames_h100/wan21.json --models wan2.1
    python -m rewrite.tools.sweep_sizes --models wan2.1 --sizes 1088x1920,1920x1088 --frames 21
    python -m rewrite.tools.sweep_sizes --sizes 480x832 --frames 81,161,241   # long clips: s per latent frame
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rewrite.tools import bench

#: the sizes issue 37 names (height x width), 81 frames
SIZES = ("480x832", "832x480", "704x1280", "720x1280", "1088x1920", "1920x1088")
#: the `lossless` speed-up each model must reach at every size (issue 37)
TARGETS = {"wan2.1": 1.9, "wan2.2": 1.75}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rewrite.tools.sweep_sizes", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--models", default="wan2.1,wan2.2", help="comma-separated Wan models")
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated HxW output sizes")
    parser.add_argument("--frames", default="81", help="comma-separated output frame counts, 1 + 4k each (long clips: "
                                                     "81,161,241 gives seconds per latent frame at 21, 41, 61)")
    parser.add_argument("--levels", default="off,lossless,channels_last", help="levels, off first")
    parser.add_argument("--repeat", type=int, default=2, help="timed calls per level (the best counts)")
    parser.add_argument("--config", default="full", choices=("full", "tiny"), help="model size")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--json", type=Path, default=None, help="write every summary and verdict here")
    return parser


def verdict(model: str, summary: dict) -> dict:
    """The row of one (model, size): ratios per level and whether `lossless` meets its target exactly."""
    levels = {r["level"]: r for r in summary["levels"]}
    lossless = levels.get("lossless")
    row = {"model": model, "size": summary["size"], "frames": summary["frames"], "device": summary["device"],
           **{f"{level}_s": r["best_s"] for level, r in levels.items()},
           **{f"{level}_speedup": r["speedup"] for level, r in levels.items() if level != "off"},
           **{f"{level}_peak_gib": r["peak_gib"] for level, r in levels.items()},
           **{f"{level}_s_per_latent_frame": r["best_s"] / (1 + (summary["frames"] - 1) // 4)
              for level, r in levels.items()}}
    if lossless is not None:
        row["target"] = TARGETS[model]
        row["meets_target"] = bool(lossless["bit_identical"]) and lossless["speedup"] >= TARGETS[model]
    off_peak = levels["off"]["peak_gib"] if "off" in levels else None
    if off_peak is not None:  # issue 37: no level's peak above off's (None on a CPU, where peaks are not read)
        row["peaks_within_off"] = all(r["peak_gib"] <= off_peak for r in levels.values() if r["peak_gib"] is not None)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in TARGETS]
    if unknown:
        parser.error(f"--models: expected from {', '.join(TARGETS)}, got {', '.join(unknown)}")
    if args.json is not None and not args.json.parent.is_dir():
        parser.error(f"--json {args.json}: directory {args.json.parent} does not exist")
    summaries, rows = [], []
    frame_counts = [f.strip() for f in args.frames.split(",") if f.strip()]
    cases = [(model, size, frames) for model in models for size in (s.strip() for s in args.sizes.split(",") if s.strip())
             for frames in frame_counts]
    for model, size, frames in cases:  # one rewrite-bench run per case
        argv_bench = ["--model", model, "--config", args.config, "--size", size, "--frames", frames,
                      "--levels", args.levels, "--repeat", str(args.repeat), "--warmup", "0"]
        if args.device is not None:
            argv_bench += ["--device", args.device]
        summary = bench.run(bench.parse_args(argv_bench))
        print(bench.format_table(summary), flush=True)
        summaries.append(summary)
        rows.append(verdict(model, summary))
        if args.json is not None:  # after every case: a run cut short keeps what it measured
            args.json.write_text(json.dumps({"rows": rows, "summaries": summaries}, indent=1, default=str))
    for row in rows:
        print(summary_line(row))
    return 0


def summary_line(row: dict) -> str:
    """One row of the closing summary: the speed-ups and the verdict."""
    ratios = "  ".join(f"{level} " + (f"{row[key]:.2f}x" if key in row else "n/a")
                       for level, key in (("lossless", "lossless_speedup"), ("channels_last", "channels_last_speedup")))
    mark = "" if "meets_target" not in row else ("meets" if row["meets_target"] else "BELOW") + f" {row['target']}x"
    peaks = {True: "  peaks <= off", False: "  a PEAK ABOVE off's", None: ""}[row.get("peaks_within_off")]
    return f"{row['model']:<7} {row['size']:>10}x{row['frames']:<4} {ratios}  {mark}{peaks}".rstrip()


if __name__ == "__main__":
    sys.exit(main())
