"""`rewrite-demo`: optimize a random-init Wan decoder and show that it decodes bit for bit like diffusers.

Runs on a CPU in under a minute with the default tiny configuration; nothing is downloaded. Exits 1 when the
optimized decode is not bit-identical (at `lossless`) or did not run through the graphs. The models and
their seeded builds come from `rewrite.supported` (the reference and the optimized decoder get the same
weights). Bad arguments stop with the usage before anything is built.

Output, in this order: one line saying what it is about to do (flushed before the slow part: building,
capturing and decoding take seconds), the verdict (``PASS`` or ``FAIL``, and ``bit-identical to diffusers:
True|False``), a short summary (shapes, graphs and their ops, pattern matches, times, and on a CPU that
CPU runs check exactness only and the speed-ups need CUDA), then with ``--report`` the whole `rewrite.report`.
A reader that closes stdout early ends the demo quietly with exit status 141 (`rewrite.tools.cli_output`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time

import torch

from rewrite import supported
from rewrite.reporting import Report
from rewrite.tools.cli_output import emit, quiet_when_stdout_closes

#: the summary's last line on a CPU, where the graphs run eagerly (no CUDA graphs, no Triton kernels)
CPU_NOTE = "on a CPU the demo checks exactness only: the speed-ups need CUDA (CUDA graphs, Triton kernels)"


def _latent_size(text: str) -> tuple[int, int] | None:
    """``"8x8"`` -> ``(8, 8)``; None unless two positive integers."""
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        return None
    return (height, width) if height > 0 and width > 0 else None


def _device_error(text: str) -> str | None:
    """Why ``--device text`` cannot run here, or None."""
    try:
        device = torch.device(text)
    except RuntimeError:
        return f"--device {text!r} is not a device (e.g. cpu, cuda, cuda:1)"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return f"--device {text}: CUDA is not available on this machine (use --device cpu)"
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s)"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from rewrite.levels import LEVELS

    parser = argparse.ArgumentParser(prog="rewrite-demo", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--model", choices=[m.name for m in supported.MODELS if m.family == "wan"], default="wan2.1",
                        help="model (default wan2.1)")
    parser.add_argument("--config", choices=supported.CONFIGS, default="tiny", help="model size (default tiny)")
    parser.add_argument("--level", choices=LEVELS, default="lossless", help="rewrite level (default lossless)")
    parser.add_argument("--dtype", choices=sorted(supported.DTYPES), default="float32", help="dtype (default float32)")
    parser.add_argument("--frames", type=int, default=5, help="latent frames, >= 1 (default 5)")
    parser.add_argument("--latent-size", default="8x8", help="latent HxW, both >= 1 (default 8x8)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="default: cuda when available, else cpu")
    parser.add_argument("--report", action="store_true",
                        help="also print the whole report(vae) after the summary: every graph's matches and what "
                             "each pattern declined (default off)")
    args = parser.parse_args(argv)
    if args.frames < 1:
        parser.error(f"--frames must be at least 1 latent frame, got {args.frames}")
    size = _latent_size(args.latent_size)
    if size is None:
        parser.error(f"--latent-size must be two positive integers like 8x8, got {args.latent_size!r}")
    args.height, args.width = size
    error = _device_error(args.device)
    if error:
        parser.error(error)
    return args


@dataclasses.dataclass
class Outcome:
    """What the two decodes gave: shapes, exactness, seconds and the optimized module's report."""

    latents: tuple[int, ...]
    video: tuple[int, ...]
    identical: bool
    max_abs: float
    reference_s: float
    first_call_s: float  # the optimized module's first decode, its capture included
    report: Report


def latent_shape(args: argparse.Namespace, z_dim: int) -> tuple[int, ...]:
    return (1, z_dim, args.frames, args.height, args.width)


def intro(args: argparse.Namespace) -> str:
    """The line printed before the slow part: what is built, decoded and compared."""
    return (f"rewrite-demo: decoding {args.frames} latent frames of {args.height}x{args.width} with a random-init "
            f"{args.model} ({args.config}, {args.dtype}, {args.device}), by diffusers and at level {args.level} ...")


def decode_both(args: argparse.Namespace) -> Outcome:
    """The slow part: build the reference and the optimized decoder (same seeded weights), decode the same
    seeded latents with both, compare."""
    from rewrite import optimize, report

    dtype, device = supported.DTYPES[args.dtype], torch.device(args.device)
    model = supported.get(args.model)
    reference = model.build(args.config, device=device, dtype=dtype)
    optimized = optimize(model.build(args.config, device=device, dtype=dtype), level=args.level)
    z = torch.randn(latent_shape(args, reference.config.z_dim), generator=torch.Generator().manual_seed(0))
    z = z.to(device=device, dtype=dtype)
    with torch.no_grad():
        start = time.perf_counter()
        expected = reference.decode(z).sample
        reference_s = time.perf_counter() - start
        start = time.perf_counter()
        actual = optimized.decode(z).sample
        first_call_s = time.perf_counter() - start
    max_abs = (actual.float() - expected.float()).abs().max().item()
    return Outcome(tuple(z.shape), tuple(actual.shape), torch.equal(actual, expected), max_abs, reference_s,
                   first_call_s, report(optimized))


def served(args: argparse.Namespace, outcome: Outcome) -> bool:
    """Whether the graphs decoded (at level off nothing is installed: the reference path is the point)."""
    return outcome.report.last_path == "graphs" or args.level == "off"


def verdict(args: argparse.Namespace, outcome: Outcome) -> tuple[list[str], int]:
    """The verdict lines and the exit status: 0 when the graphs served the decode and it is bit-identical
    (at ``channels_last``, within its tolerance contract: any difference is reported, not failed), else 1."""
    ok = served(args, outcome) and (outcome.identical or args.level == "channels_last")
    through = ", decoded through the rewritten graphs" if outcome.report.last_path == "graphs" else ""
    lines = [f"{'PASS' if ok else 'FAIL'}: bit-identical to diffusers: {outcome.identical}"
             + ("" if outcome.identical else f" (max abs difference {outcome.max_abs:.3g})") + through]
    if not served(args, outcome):  # a fallback is bit-identical too, and shows nothing
        lines.append(f"the optimized module did not decode through its graphs: {outcome.report.last_reason}")
    return lines, 0 if ok else 1


def summary(args: argparse.Namespace, outcome: Outcome) -> list[str]:
    """A few indented lines: shapes, graphs, matches, times, the CPU note where it applies, the --report hint."""
    graphs = outcome.report.graphs
    matches = sum(sum(g.matches.values()) for g in graphs)
    patterns = len({name for g in graphs for name, count in g.matches.items() if count})
    described = ", ".join(f"{g.name} ({g.ops} ops)" for g in graphs) or "none"
    lines = [f"  latents {outcome.latents} -> video {outcome.video}",
             f"  graphs: {described}; {matches} matches of {patterns} pattern{'' if patterns == 1 else 's'}",
             f"  time: diffusers {outcome.reference_s:.2f} s; optimized first call {outcome.first_call_s:.2f} s "
             f"(capture {outcome.report.first_call_seconds:.2f} s of it)"]
    if torch.device(args.device).type == "cpu":
        lines.append(f"  {CPU_NOTE}")
    if not args.report:
        lines.append("  --report prints the whole report (matches per pattern, what each pattern declined)")
    return lines


@quiet_when_stdout_closes
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rewrite-demo``: 0 (pass), 1 (fail: `verdict`), 2 (bad arguments) or
    `rewrite.tools.cli_output.BROKEN_PIPE_STATUS` (stdout closed early)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    emit(intro(args))
    outcome = decode_both(args)
    lines, status = verdict(args, outcome)
    emit("\n".join(lines + summary(args, outcome)))
    if args.report:
        emit(outcome.report)
    return status


if __name__ == "__main__":
    sys.exit(main())
