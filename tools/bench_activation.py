"""Time the AuK alias-free SnakeBeta activation, eager module against the fused Triton op, per decoder shape.

For every distinct activation shape ``[batch, C, T]`` of a clip (enumerated from `AuKConfig`: 18
activations per upsample stage, 3 AMP blocks x 3 residual units x 2, plus ``activation_post``; 109 on
the default geometry), time the eager `AliasFreeSnakeBeta` and ``rewrite::alias_free_snake`` (Triton
path) with ``triton.testing.do_bench`` (median; host overhead included) and
``do_bench_cudagraph`` (median; GPU time only, as a CUDA-graph replay of the decoder would see it), and
report the SNR (dB) of the Triton output against the eager output in fp32 (for ``--dtype`` bfloat16 or
float16: against the fp32 module on the same rounded input, next to the eager module's own SNR).
Totals weight each shape by how many activations of a clip have it. Needs CUDA; ``--help`` works
anywhere.

    python -m rewrite.tools.bench_activation [--frames 250] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import sys
from collections import Counter

DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ActivationShape:
    channels: int
    length: int
    count: int  # activations of a clip with this shape


@dataclasses.dataclass
class ShapeResult:
    channels: int
    length: int
    count: int
    eager_ms: float
    triton_ms: float
    eager_graph_ms: float
    triton_graph_ms: float
    snr_db: float
    max_abs: float
    eager_snr_db: float  # the eager module in --dtype against itself in fp32 (inf for float32)
    path: str


def activation_shapes(config, frames: int) -> list[ActivationShape]:
    """The distinct ``(C, T)`` of a decoder's activations for ``frames`` latent frames, with counts."""
    per_stage = sum(2 * len(dilations) for dilations in config.resblock_dilation_sizes)
    counts: Counter = Counter()
    length = frames
    for channels, rate in zip(config.stage_channels(), config.upsample_rates):
        length *= rate
        counts[(channels, length)] += per_stage
    counts[(config.stage_channels()[-1], length)] += 1  # activation_post
    return [ActivationShape(c, t, n) for (c, t), n in counts.items()]


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench_activation", description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=250, help="latent frames (250 = a 5 s clip at 50 Hz)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="activation dtype (SNR is always against the eager fp32 module)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--param-std", type=float, default=0.5,
                        help="std of the random log-scale alpha/beta (0 gives the init exp(0) = 1)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-' for stdout)")
    args = parser.parse_args(argv)
    if args.frames < 1 or args.batch < 1:
        parser.error("--frames and --batch must be >= 1")
    return args


def _snr_db(reference, candidate) -> float:
    error = (candidate.double() - reference.double()).pow(2).sum().item()
    signal = reference.double().pow(2).sum().item()
    return math.inf if error == 0 else 10.0 * math.log10(signal / error)


def _make_case(shape: ActivationShape, args, torch, dtype):
    """A seeded eager module (fp32) and an input of the shape, both on CUDA."""
    from rewrite.models.auk.model import AliasFreeSnakeBeta

    generator = torch.Generator(device="cuda").manual_seed(args.seed + shape.channels)
    module = AliasFreeSnakeBeta(shape.channels).cuda().eval()
    with torch.no_grad():
        for param in (module.act.alpha, module.act.beta):
            param.copy_(torch.randn(param.shape, generator=generator, device="cuda") * args.param_std)
    x = torch.randn((args.batch, shape.channels, shape.length), generator=generator, device="cuda")
    return module, x.to(dtype)


def measure(shape: ActivationShape, args) -> ShapeResult:
    import torch
    from triton.testing import do_bench, do_bench_cudagraph

    from rewrite.models.auk import alias_free

    dtype = getattr(torch, args.dtype)
    module32, x = _make_case(shape, args, torch, dtype)
    module = copy.deepcopy(module32).to(dtype)  # (Module.to works in place)
    params = (module.act.alpha, module.act.beta, module.taps)
    with torch.inference_mode():
        path, reason = alias_free.choose_implementation(x, *params)
        fused = lambda: alias_free.alias_free_snake(x, *params)  # noqa: E731
        eager = lambda: module(x)  # noqa: E731
        reference32, output = module32(x.float()), fused()
        snr, max_abs = _snr_db(reference32, output), (output.double() - reference32.double()).abs().max().item()
        eager_snr = _snr_db(reference32, eager())
        times = [do_bench(fn, return_mode="median") for fn in (eager, fused)]
        graph_times = [do_bench_cudagraph(fn, return_mode="median") for fn in (eager, fused)]
    return ShapeResult(shape.channels, shape.length, shape.count, *times, *graph_times, snr, max_abs, eager_snr,
                       path if reason is None else f"{path} ({reason})")


def _totals(results: list[ShapeResult]) -> dict:
    total = {name: sum(r.count * getattr(r, name) for r in results)
             for name in ("eager_ms", "triton_ms", "eager_graph_ms", "triton_graph_ms")}
    total["activations"] = sum(r.count for r in results)
    total["speedup"] = total["eager_ms"] / total["triton_ms"]
    total["graph_speedup"] = total["eager_graph_ms"] / total["triton_graph_ms"]
    total["min_snr_db"] = min(r.snr_db for r in results)
    return total


def print_table(results: list[ShapeResult], total: dict, out=sys.stdout) -> None:
    header = (f"{'C':>5} {'T':>7} {'n':>3} | {'eager ms':>9} {'triton ms':>9} {'x':>5} | "
              f"{'eager gr':>9} {'triton gr':>9} {'x':>5} | {'SNR dB':>7} {'max-abs':>9} {'eager SNR':>9}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in results:
        print(f"{r.channels:>5} {r.length:>7} {r.count:>3} | {r.eager_ms:>9.4f} {r.triton_ms:>9.4f} "
              f"{r.eager_ms / r.triton_ms:>5.1f} | {r.eager_graph_ms:>9.4f} {r.triton_graph_ms:>9.4f} "
              f"{r.eager_graph_ms / r.triton_graph_ms:>5.1f} | {r.snr_db:>7.1f} {r.max_abs:>9.2e} "
              f"{r.eager_snr_db:>9.1f}", file=out)
    print("-" * len(header), file=out)
    print(f"total over {total['activations']} activations (ms, count-weighted): eager {total['eager_ms']:.3f}, "
          f"triton {total['triton_ms']:.3f} ({total['speedup']:.1f}x); GPU only (CUDA graph): eager "
          f"{total['eager_graph_ms']:.3f}, triton {total['triton_graph_ms']:.3f} ({total['graph_speedup']:.1f}x); "
          f"min SNR {total['min_snr_db']:.1f} dB", file=out)
    paths = sorted({r.path for r in results})
    print(f"path taken: {', '.join(paths)}", file=out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from rewrite.models.auk.model import AuKConfig

    if not torch.cuda.is_available():
        print("bench_activation: needs a CUDA device", file=sys.stderr)
        return 2
    config = AuKConfig()
    shapes = activation_shapes(config, args.frames)
    results = [measure(shape, args) for shape in shapes]
    total = _totals(results)
    print(f"AuK alias-free activation, {args.frames} latent frames, batch {args.batch}, {args.dtype}, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print_table(results, total)
    if args.json:
        payload = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "frames": args.frames,
                   "batch": args.batch, "dtype": args.dtype, "param_std": args.param_std,
                   "shapes": [dataclasses.asdict(r) for r in results], "total": total}
        text = json.dumps(payload, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as handle:
                handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
