"""Streamed Wan decodes against `decode`: the first push's latency and the whole streamed clip's time.

Usage (`python -m rewrite.tools.stream_bench`; the GPU measurement of issue 20's streaming targets):

    python -m rewrite.tools.stream_bench --model wan2.1 --size 720x1280 --frames 81 --repeat 5 --json stream.json
    python -m rewrite.tools.stream_bench --model wan2.1 --config tiny --device cpu --size 64x96 --frames 9  # dry run

One model (random-init, `rewrite-bench`'s seeded weights and latents), optimized at `--level` (`lossless`),
warmed up for the clip's latent size (`rewrite.warmup(shapes=[(h, w)], frames=[t])`), then one untimed
round of each way of decoding (what is left to check or allocate on a first use: the session's per-length
post_quant_conv check, the caching allocator's blocks), then `--repeat` timed rounds of:

  decode    `vae.decode(z).sample` of the whole latent
  stream    `vae.decode_stream(z)` to its last piece (also: the seconds until its first piece)
  session   `rewrite.stream(vae, ...)`: a new clip, its latent frames pushed one at a time; the seconds of
            every push until its frames are returned (on the device: CUDA-synchronized)

A session push raises where the per-frame post_quant_conv would differ from the whole clip's
(`rewrite.models.wan.stream.frame_local_post_quant_conv`); the tool then reports why and times the rest.
Times are `time.perf_counter` around `torch.cuda.synchronize()` on CUDA (plain on CPU); the summary is the
median over the rounds. Every round's stream and session pieces, concatenated along the frames, are checked
`torch.equal` to that round's decode. Prints a table; `--json PATH` also writes the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from rewrite import supported
from rewrite.tools.bench import DTYPES, WanBench, _path_of, _sync, _timed, _triton_version, build_bench

WAN_MODELS = tuple(model.name for model in supported.MODELS if model.family == "wan")


def parse_args(argv) -> argparse.Namespace:
    from rewrite.levels import LEVELS

    parser = argparse.ArgumentParser(prog="python -m rewrite.tools.stream_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=WAN_MODELS, default="wan2.1")
    parser.add_argument("--config", choices=supported.CONFIGS, default="full")
    parser.add_argument("--size", default="720x1280", help="output HxW in pixels (default 720x1280)")
    parser.add_argument("--frames", type=int, default=81, help="output frames, 1 + 4k (default 81: 21 latent frames)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--level", choices=[level for level in LEVELS if level != "off"], default="lossless")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds (the median is reported)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    args.seconds = None  # what WanBench.check_args refuses for Wan
    WanBench.check_args(parser, args)
    if args.repeat < 1 or args.batch < 1:
        parser.error("--repeat and --batch must be >= 1")
    if args.json is not None and not Path(args.json).parent.is_dir():
        parser.error(f"--json {args.json}: directory {Path(args.json).parent} does not exist")
    return args


def _stream_round(vae, z: torch.Tensor, device: torch.device) -> tuple[float, float, torch.Tensor]:
    """`decode_stream(z)` to its last piece: (seconds to the first piece, seconds in all, the pieces joined)."""
    pieces, first = [], None
    _sync(device)
    start = time.perf_counter()
    for _, frames in vae.decode_stream(z):
        pieces.append(frames)
        if first is None:
            _sync(device)
            first = time.perf_counter() - start
    _sync(device)
    return first, time.perf_counter() - start, torch.cat(pieces, 2)


def _session_round(vae, z: torch.Tensor, device: torch.device) -> tuple[list[float], float, torch.Tensor]:
    """A new session clip of z's latent frames pushed one at a time: (seconds of each push, seconds in all,
    the pushes' frames joined)."""
    import rewrite

    pieces, pushes = [], []
    with rewrite.stream(vae, batch=z.shape[0], height=z.shape[3], width=z.shape[4]) as session:
        _sync(device)
        start = time.perf_counter()
        for i in range(z.shape[2]):
            frames, seconds = _timed(lambda: session.push(z[:, :, i : i + 1]), device)
            pieces.append(frames)
            pushes.append(seconds)
        total = time.perf_counter() - start
    return pushes, total, torch.cat(pieces, 2)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def measure(args) -> dict:
    """Build, optimize, warm up, then the untimed and the timed rounds (see the module docstring)."""
    from rewrite import optimize, report, warmup

    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    bench = build_bench(args, device, dtype)
    vae, (case,) = bench.vae, bench.cases()
    z = case.z
    result: dict = {"model": args.model, "config": args.config, "size": f"{args.height}x{args.width}",
                    "frames": args.frames, "latents": list(z.shape), "batch": args.batch, "dtype": args.dtype,
                    "level": args.level, "repeat": args.repeat,
                    "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "triton": _triton_version()}
    with torch.no_grad():
        optimize(vae, level=args.level)
        warm, result["warmup_s"] = _timed(lambda: warmup(vae, shapes=[tuple(z.shape[3:])], frames=[z.shape[2]],
                                                         batch=z.shape[0]), device)
        result["warmup_note"] = warm.note
        # untimed first round: what a first use of each way still does (checks, allocator blocks) is not timed
        _, result["first_round_decode_s"] = _timed(lambda: vae.decode(z).sample, device)
        result["first_round_stream_first_piece_s"], result["first_round_stream_s"], _ = _stream_round(vae, z, device)
        try:  # a push raises where the per-frame post_quant_conv would differ from the whole clip's
            pushes, result["first_round_session_s"], _ = _session_round(vae, z, device)
            result["first_round_session_first_push_s"], result["session_error"] = pushes[0], None
        except RuntimeError as error:
            result["first_round_session_s"] = result["first_round_session_first_push_s"] = None
            result["session_error"] = str(error)
        rounds = {"decode_s": [], "stream_s": [], "stream_first_piece_s": [], "session_s": [],
                  "session_first_push_s": [], "session_later_push_s": []}
        stream_equal = session_equal = True
        for _ in range(args.repeat):
            reference, seconds = _timed(lambda: vae.decode(z).sample, device)
            rounds["decode_s"].append(seconds)
            first, seconds, streamed = _stream_round(vae, z, device)
            rounds["stream_first_piece_s"].append(first)
            rounds["stream_s"].append(seconds)
            stream_equal = stream_equal and torch.equal(streamed, reference)
            del streamed
            if result["session_error"] is None:
                pushes, seconds, pushed = _session_round(vae, z, device)
                rounds["session_s"].append(seconds)
                rounds["session_first_push_s"].append(pushes[0])
                rounds["session_later_push_s"].extend(pushes[1:])
                session_equal = session_equal and torch.equal(pushed, reference)
                del pushed
            del reference
        result["path"] = _path_of(report(vae))
    result["rounds"] = rounds
    for key in ("decode_s", "stream_s", "stream_first_piece_s", "session_s", "session_first_push_s"):
        result[key] = _median(rounds[key]) if rounds[key] else None
    later = rounds["session_later_push_s"]
    result["session_later_push_median_s"] = _median(later) if later else None
    result["session_later_push_max_s"] = max(later) if later else None
    result["stream_over_decode"] = result["stream_s"] / result["decode_s"]
    served = result["session_error"] is None
    result["session_over_decode"] = result["session_s"] / result["decode_s"] if served else None
    result["stream_bit_identical"], result["session_bit_identical"] = stream_equal, session_equal if served else None
    if device.type == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return result


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def format_table(r: dict) -> str:
    """The medians side by side, with the ratios to decode and the equality checks."""
    head = (f"{r['model']} ({r['config']}) {r['size']} x {r['frames']} frames, batch {r['batch']}, {r['dtype']}, "
            f"{r['level']}, {r['device']}; median of {r['repeat']} rounds; warm-up {r['warmup_s']:.2f} s")
    rows = [("decode", r["decode_s"], 1.0, "-", "(reference)"),
            ("stream", r["stream_s"], r["stream_over_decode"], _ms(r["stream_first_piece_s"]),
             "torch.equal" if r["stream_bit_identical"] else "DIFFERS"),
            ("session", r["session_s"], r["session_over_decode"], _ms(r["session_first_push_s"]),
             "torch.equal" if r["session_bit_identical"] else "DIFFERS")]
    lines = [head, f"{'way':8s} {'total':>10s} {'/ decode':>9s} {'first piece':>12s}  frames"]
    lines += [f"{name:8s} {seconds:>8.3f} s {ratio:>8.3f}x {first:>12s}  {equal}"
              for name, seconds, ratio, first, equal in rows if seconds is not None]
    if r["session_error"] is not None:
        lines.append(f"session: not served ({r['session_error']})")
    else:
        lines.append(f"session pushes after the first: median {_ms(r['session_later_push_median_s'])}, "
                     f"max {_ms(r['session_later_push_max_s'])}; untimed first round: first push "
                     f"{_ms(r['first_round_session_first_push_s'])}, session {r['first_round_session_s']:.3f} s")
    lines.append(f"path: {r['path']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = measure(args)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2, default=str)
    return 0 if result["stream_bit_identical"] and result["session_bit_identical"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
