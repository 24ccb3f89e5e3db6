"""`rewrite-demo`: optimize a random-init Wan decoder and show that it decodes bit for bit like diffusers.

Runs on a CPU in under a minute with the default tiny configuration; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from rewrite.levels import LEVELS
    from rewrite.models.wan import SIZES, WAN_VERSIONS

    parser = argparse.ArgumentParser(prog="rewrite-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=WAN_VERSIONS, default="wan2.1")
    parser.add_argument("--config", choices=SIZES, default="tiny", help="model size (default: tiny)")
    parser.add_argument("--level", choices=LEVELS, default="lossless")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--frames", type=int, default=5, help="latent frames (default 5)")
    parser.add_argument("--latent-size", default="8x8", help="latent HxW (default 8x8)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from rewrite import optimize, report
    from rewrite.models.wan import build_wan

    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        height, width = (int(v) for v in args.latent_size.lower().split("x"))
    except ValueError:
        print(f"rewrite-demo: --latent-size must look like 8x8, got {args.latent_size!r}", file=sys.stderr)
        return 2
    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    reference = build_wan(args.model, args.config).to(device=device, dtype=dtype)
    optimized = optimize(build_wan(args.model, args.config).to(device=device, dtype=dtype), level=args.level)
    z = torch.randn(1, reference.config.z_dim, args.frames, height, width, generator=torch.Generator().manual_seed(0))
    z = z.to(device=device, dtype=dtype)
    with torch.no_grad():
        start = time.perf_counter()
        expected = reference.decode(z).sample
        reference_seconds = time.perf_counter() - start
        start = time.perf_counter()
        actual = optimized.decode(z).sample
        first_call_seconds = time.perf_counter() - start
    print(report(optimized))
    print(f"latents {tuple(z.shape)} -> video {tuple(actual.shape)} ({args.model}, {args.config}, {args.dtype}, {device})")
    print(f"reference decode {reference_seconds:.2f} s; optimized first call (capture included) {first_call_seconds:.2f} s")
    identical = torch.equal(actual, expected)
    print(f"bit-identical to diffusers: {identical}")
    if not identical:
        print(f"max abs difference: {(actual.float() - expected.float()).abs().max().item():.3g}")
    return 0 if identical or args.level == "channels_last" else 1


if __name__ == "__main__":
    sys.exit(main())
