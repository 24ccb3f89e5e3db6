"""`rewrite-demo`: optimize a random-init Wan decoder and show that it decodes bit for bit like diffusers.

Runs on a CPU in under a minute with the default tiny configuration; nothing is downloaded. Exits 1 when the
optimized decode is not bit-identical (at `lossless`) or did not run through the graphs. The models and
their seeded builds come from `rewrite.supported` (the reference and the optimized decoder get the same
weights). Bad arguments stop with the usage before anything is built.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch

from rewrite import supported


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

    parser = argparse.ArgumentParser(prog="rewrite-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=[m.name for m in supported.MODELS if m.family == "wan"], default="wan2.1")
    parser.add_argument("--config", choices=supported.CONFIGS, default="tiny", help="model size (default: tiny)")
    parser.add_argument("--level", choices=LEVELS, default="lossless")
    parser.add_argument("--dtype", choices=sorted(supported.DTYPES), default="float32")
    parser.add_argument("--frames", type=int, default=5, help="latent frames, >= 1 (default 5)")
    parser.add_argument("--latent-size", default="8x8", help="latent HxW, both >= 1 (default 8x8)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
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


def main(argv: list[str] | None = None) -> int:
    from rewrite import optimize, report

    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    dtype, device = supported.DTYPES[args.dtype], torch.device(args.device)
    model = supported.get(args.model)
    reference = model.build(args.config, device=device, dtype=dtype)
    optimized = optimize(model.build(args.config, device=device, dtype=dtype), level=args.level)
    z = torch.randn(1, reference.config.z_dim, args.frames, args.height, args.width,
                    generator=torch.Generator().manual_seed(0))
    z = z.to(device=device, dtype=dtype)
    with torch.no_grad():
        start = time.perf_counter()
        expected = reference.decode(z).sample
        reference_seconds = time.perf_counter() - start
        start = time.perf_counter()
        actual = optimized.decode(z).sample
        first_call_seconds = time.perf_counter() - start
    summary = report(optimized)
    print(summary)
    print(f"latents {tuple(z.shape)} -> video {tuple(actual.shape)} ({args.model}, {args.config}, {args.dtype}, {device})")
    print(f"reference decode {reference_seconds:.2f} s; optimized first call (capture included) {first_call_seconds:.2f} s")
    identical = torch.equal(actual, expected)
    print(f"bit-identical to diffusers: {identical}")
    if not identical:
        print(f"max abs difference: {(actual.float() - expected.float()).abs().max().item():.3g}")
    served = summary.last_path == "graphs" or args.level == "off"
    if not served:  # a fallback is bit-identical too, and shows nothing
        print(f"the optimized module did not decode through its graphs: {summary.last_reason}")
    return 0 if served and (identical or args.level == "channels_last") else 1


if __name__ == "__main__":
    sys.exit(main())
