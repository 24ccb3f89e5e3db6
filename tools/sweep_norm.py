"""Time the one-pass norm of level ``channels_last`` against the exact two-pass kernel per Wan shape.

For each Wan norm-before-conv shape (a steady step at 720p / 480p: x NCDHW, 2 cache frames, SiLU, the 3x3x3
conv's zero pad), time `triton_norm_fast.rms_norm_padded_one_pass` and `triton_norm.rms_norm_padded_channels_last`
(the ``lossless`` kernel, ATen's summation order) with ``triton.testing.do_bench_cudagraph`` (median GPU
time) and report both, the bytes each moves per ms and the max-abs difference. This is the sweep that
`wan_fast._ONE_PASS_NORM_CHANNELS` is read from; needs CUDA (``--help`` works anywhere).

    python -m rewrite.tools.sweep_norm [--dtype bfloat16] [--only 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys

from rewrite.tools.sweep_conv3d import write_results

# (name, channels, frames, height, width): the inputs of the convs `triton_conv3d.chosen` serves
SHAPES = [("96 @ 4x720x1280", 96, 4, 720, 1280), ("192 @ 4x360x640", 192, 4, 360, 640),
          ("384 @ 2x180x320", 384, 2, 180, 320), ("384 @ 1x90x160", 384, 1, 90, 160),
          ("96 @ 4x480x832", 96, 4, 480, 832), ("192 @ 4x240x416", 192, 4, 240, 416),
          ("512 @ 4x180x320", 512, 4, 180, 320), ("256 @ 4x360x640", 256, 4, 360, 640),
          ("1024 @ 2x90x160", 1024, 2, 90, 160), ("1024 @ 1x45x80", 1024, 1, 45, 80),
          # Wan 2.2's encoder at 704x1280 (its norms before the convs cuDNN keeps or the Triton conv serves)
          ("160 @ 4x352x640", 160, 4, 352, 640), ("320 @ 4x176x320", 320, 4, 176, 320),
          ("640 @ 2x88x160", 640, 2, 88, 160), ("640 @ 1x44x80", 640, 1, 44, 80)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--only", default=None, help="only the shapes whose name starts with this")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    import torch
    import triton.testing

    from rewrite.kernels.norm import aten_reduction
    from rewrite.kernels.norm import rms_norm as triton_norm
    from rewrite.kernels.norm import one_pass as triton_norm_fast

    if not torch.cuda.is_available():
        print("sweep_norm: needs CUDA", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    pad = [1, 1, 1, 1, 0, 0]
    results = []
    for name, c, t, h, w in SHAPES:
        if args.only and not name.startswith(args.only):
            continue
        torch.manual_seed(0)
        x = 3 * torch.randn(1, c, t, h, w, device="cuda", dtype=dtype)
        cache = torch.randn(1, c, 2, h, w, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
        gamma = 1 + 0.1 * torch.randn(c, 1, 1, 1, device="cuda", dtype=dtype)
        split = aten_reduction.plan(x, torch.float32).split

        def exact():
            return triton_norm.rms_norm_padded_channels_last(x, gamma, c ** 0.5, 0.0, 1e-12, True, True, split, cache,
                                                             pad)

        def one_pass():
            return triton_norm_fast.rms_norm_padded_one_pass(x, gamma, c ** 0.5, 0.0, 1e-12, True, cache, pad)

        difference = (exact()[0].float() - one_pass()[0].float()).abs().max().item()
        moved = x.numel() * x.element_size() * (1 + (t + 2) / t)  # x read once, the padded input written
        row = {"shape": name, "max_abs": difference}
        for label, run in (("exact", exact), ("one_pass", one_pass)):
            ms = triton.testing.do_bench_cudagraph(run)
            row[f"{label}_ms"] = ms
        print(f"{name:<18} exact {row['exact_ms']:7.3f} ms  one-pass {row['one_pass_ms']:7.3f} ms "
              f"({moved / row['one_pass_ms'] / 1e6:5.0f} GB/s)  max-abs {difference:.3g}", flush=True)
        results.append(row)
    if args.json:
        write_results(args.json, args.dtype, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
