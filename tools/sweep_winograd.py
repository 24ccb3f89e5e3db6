"""Time the Winograd conv (`rewrite.kernels.winograd`) against cuDNN and the Triton direct conv per Wan conv shape.

For each 3x3x3 conv shape of a Wan steady step (`sweep_conv3d.SHAPES`, the `K3` ones) and each candidate
`WinogradTile`: cuDNN's channels-last conv3d of the padded input (no bias: the `lossless` path), the Triton
direct conv with `launch_config`'s tile where it serves the shape, and the Winograd kernel: F(2x2, 3x3) with the
weight transformed once ahead (`transformed_weight`, not timed: an op keeps it; the materialized form's input
transform and its temporary inside the timed call), F(4x4, 3x3) with the weight's points computed in each timed call
and its point scales kept, as the op does (`weight_store.transformed_4_for`; that time alone is in the row too).
Times are medians of ``triton.testing.do_bench_cudagraph``; the rate is the direct conv's FLOPs over the time (issue
40's "direct-equivalent TFLOP/s"); max-abs is against cuDNN's fp32 conv of the same bf16/fp16 operands, beside the
direct conv's. This is the sweep `winograd._MEASURED_FASTER` is read from; needs CUDA (``--help`` works anywhere).

    python -m rewrite.tools.sweep_winograd [--dtype bfloat16] [--shapes wan22,wan21] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys

from rewrite.tools.sweep_conv3d import K3, SHAPES, write_results


#: `large_tile.TransformTiles` tried for F(4x4, 3x3)'s transforms: (input patches, channels, warps, output blocks,
#: channels, warps); the first is the default
TRANSFORM_VARIANTS = ((8, 64, 8, 8, 64, 8), (4, 64, 4, 4, 64, 4), (8, 32, 4, 8, 32, 4), (16, 64, 8, 16, 32, 8),
                      (8, 64, 4, 8, 64, 4))


def candidate_tiles() -> dict:
    """The tiles tried per shape, by group (`WinogradTile`'s fields, in order): the fused form where sm_90's
    register file holds its five accumulators with few spills (ptxas, checked on a CPU); the materialized form's
    pipelined TMA GEMM at the usual tensor-core block shapes; one of those with its input transform by 1 and 2
    output frames (the temporary's size against the time); the materialized form with its 16 point GEMMs as one
    pipelined loop; split (one GEMM per program into fp32 sums, then the output transform); large, the split
    form of F(4x4, 3x3) (`large_tile`), and large_more, its GEMM at further blocks; split_best is the split tile the
    H100's table holds."""
    from rewrite.kernels.winograd.winograd import WinogradTile

    fused = [WinogradTile(m, n, k, warps, 2) for m, n, k, warps in ((32, 64, 32, 8), (64, 64, 32, 8), (32, 128, 32, 8),
                                                                    (64, 64, 64, 8))]
    materialized = [WinogradTile(m, n, k, warps, stages, True) for m, n, k, warps, stages in (
        (64, 64, 64, 4, 3), (64, 128, 64, 8, 3), (128, 64, 64, 8, 3), (128, 128, 64, 8, 3), (64, 128, 32, 4, 4),
        (128, 128, 32, 8, 4))]
    by_frame = [WinogradTile(64, 128, 64, 8, 3, True, frames) for frames in (1, 2)]  # the temporary bounded
    one_loop = [WinogradTile(m, n, k, warps, stages, True, 0, True) for m, n, k, warps, stages in (
        (64, 64, 64, 4, 3), (64, 64, 64, 4, 4), (128, 64, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4),
        (64, 128, 64, 4, 4))]
    split = [WinogradTile(m, n, k, warps, stages, True, 0, False, True) for m, n, k, warps, stages in (
        (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (64, 128, 64, 4, 4))]
    large = [WinogradTile(m, n, k, warps, stages, True, 0, False, True, 4) for m, n, k, warps, stages in (
        (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4))]
    # F(4x4, 3x3)'s point GEMMs at deeper K steps, taller M blocks and more stages (sm_90's shared memory holds
    # each: at most 192 KiB of operand stages)
    large_more = [WinogradTile(m, n, k, warps, stages, True, 0, False, True, 4) for m, n, k, warps, stages in (
        (128, 128, 128, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 4), (256, 128, 32, 8, 4),
        (128, 128, 32, 8, 5))]
    return {"fused": fused, "materialized": materialized, "by_frame": by_frame, "one_loop": one_loop, "split": split,
            "split_best": split[1:2], "large": large, "large_more": large_more}


def _time_breakdown(row: dict, padded, weight, bound, tiles) -> None:
    """Where the time goes, into `row`: the materialized form's input transform alone (by its blocks), the 16
    GEMMs' core as torch.bmm of the same sizes (issue 40's "GEMM core" measurement; no transforms, bf16 out) and,
    when a tile is F(4x4, 3x3), its two transforms alone by their programs' tiles."""
    import torch
    import triton.testing

    from rewrite.kernels.winograd import large_tile, materialized
    from rewrite.kernels.winograd.transforms import input_scale_4

    cin, (t, h, w) = padded.shape[1], (side - 2 for side in padded.shape[2:])
    cout, dtype = weight.shape[0], padded.dtype
    flops = 2 * cout * cin * 27 * t * h * w
    out = torch.empty(1, cout, t, h, w, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
    row["input_transform_ms"] = triton.testing.do_bench_cudagraph(
        lambda p=padded: materialized.input_transform(p))
    row["input_transform_blocks_ms"] = {
        f"{bm}x{bc}": triton.testing.do_bench_cudagraph(
            lambda p=padded, bm=bm, bc=bc: materialized.input_transform(p, bm, bc))
        for bm, bc in ((32, 32), (64, 32), (32, 64), (64, 64), (16, 128))
        if bc <= cin and (bm, bc) != materialized.transform_blocks(cin)}  # the default is timed above
    patches = t * ((h + 1) // 2) * ((w + 1) // 2)
    lhs = torch.randn(16, patches, 3 * cin, device="cuda", dtype=dtype)
    rhs = torch.randn(16, 3 * cin, cout, device="cuda", dtype=dtype)
    row["bmm_core_ms"] = triton.testing.do_bench_cudagraph(lambda a=lhs, b=rhs: torch.bmm(a, b))
    del lhs, rhs
    print(f"  input transform blocks (m x c): {row['input_transform_blocks_ms']}", flush=True)
    print(f"  input transform alone {row['input_transform_ms']:8.3f} ms; 16 GEMMs as torch.bmm "
          f"{row['bmm_core_ms']:8.3f} ms ({flops / row['bmm_core_ms'] / 1e9:6.0f} direct-equivalent TFLOP/s)",
          flush=True)
    if any(tile.output_block == 4 for tile in tiles):  # the transforms alone, by their programs' tiles
        rows, columns = large_tile.blocks(h, w)
        sums = torch.randn(36, t * rows * columns, cout, device="cuda")
        inverse = torch.ones(36, device="cuda")
        row["large_transforms_ms"] = {}
        for variant in TRANSFORM_VARIANTS:
            programs = large_tile.TransformTiles(*variant)
            row["large_transforms_ms"][str(variant)] = (
                triton.testing.do_bench_cudagraph(lambda p=padded, s=input_scale_4(bound), programs=programs:
                                                  large_tile.input_transform(p, s, programs)),
                triton.testing.do_bench_cudagraph(lambda programs=programs: large_tile.output_transform(
                    sums, inverse, None, None, out, programs)))
        del sums
        print(f"  F(4x4, 3x3) transforms alone (input, output ms) by tiles {row['large_transforms_ms']}",
              flush=True)


def winners(sweep: dict, margin: float = 1.05) -> dict:
    """From a sweep's JSON (as `main` writes it): {(in channels, out channels, width, dtype): tile} for each shape
    whose fastest tile ran at least `margin` times faster than both cuDNN and the direct conv. These are candidates
    for `common._MEASURED_FASTER`, which takes an entry only after a full decode measured it faster within the
    contract (docs/data/experiments/gpu_winograd_widths.sh does both in one run)."""
    import torch

    from rewrite.kernels.winograd.winograd import WinogradTile

    dtype = getattr(torch, sweep["dtype"])
    chosen = {}
    for row in sweep["results"]:
        timed = [entry for entry in row["tiles"] if "ms" in entry]
        if not timed or "channels" not in row:
            continue
        best = min(timed, key=lambda entry: entry["ms"])
        rival = min(row["cudnn_ms"], row.get("direct_ms", float("inf")))
        if best["ms"] * margin <= rival:
            (cin, cout), width = row["channels"], row["frames_height_width"][2]
            chosen[(cin, cout, width, dtype)] = WinogradTile(*best["tile"])
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--shapes", default="wan22,wan21", help=f"comma-separated: {', '.join(SHAPES)}")
    parser.add_argument("--only", default=None,
                        help="only the shapes whose name starts with one of these (comma-separated)")
    parser.add_argument("--groups", default="fused,materialized,by_frame,one_loop,split,large",
                        help="the candidate tile groups to try (comma-separated)")
    parser.add_argument("--max-tiles", type=int, default=None, help="try only the first N candidate tiles")
    parser.add_argument("--core", action="store_true",
                        help="time only cuDNN, the direct conv and the tiles (no transform or GEMM-core breakdown)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    import torch
    import triton.testing

    from rewrite.kernels.conv3d import conv3d as triton_conv3d
    from rewrite.kernels.winograd import large_tile, winograd
    from rewrite.kernels.winograd.transforms import transformed_weight
    from rewrite.kernels.winograd.weight_store import transformed_4_for
    from rewrite.ops import compile_ahead

    if not torch.cuda.is_available():
        print("sweep_winograd: needs CUDA", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    cl = torch.channels_last_3d
    groups = candidate_tiles()
    tiles = [tile for group in args.groups.split(",") for tile in groups[group]][:args.max_tiles]
    results = []
    for family in args.shapes.split(","):
        for name, cin, cout, t, h, w, kernel in SHAPES.get(family, ()):
            if kernel != K3 or (args.only and not name.startswith(tuple(args.only.split(",")))):
                continue
            torch.manual_seed(0)
            padded = torch.randn(1, cin, t + 2, h + 2, w + 2, device="cuda", dtype=dtype).contiguous(memory_format=cl)
            weight = (torch.randn(cout, cin, *kernel, device="cuda", dtype=dtype) / (27 * cin) ** 0.5
                      ).contiguous(memory_format=cl)
            flops = 2 * cout * cin * 27 * t * h * w
            exact = torch.ops.aten.conv3d.default(padded.float(), weight.float(), None)
            out = torch.empty(exact.shape, device="cuda", dtype=dtype).contiguous(memory_format=cl)

            def cudnn(x=padded, wt=weight):
                return torch.ops.aten.conv3d.default(x, wt, None)

            ms = triton.testing.do_bench_cudagraph(cudnn)
            row = {"shape": name, "channels": [cin, cout], "frames_height_width": [t, h, w], "cudnn_ms": ms,
                   "cudnn_tflops": flops / ms / 1e9, "cudnn_max_abs": (cudnn().float() - exact).abs().max().item(), "tiles": []}
            print(f"{name:<24} cudnn {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  max-abs {row['cudnn_max_abs']:.3g}",
                  flush=True)
            if triton_conv3d.unsupported_reason(padded.shape, weight.shape, dtype) is None:
                def direct(p=padded, wt=weight, o=out):
                    triton_conv3d.conv3d_channels_last(p, wt, None, None, o)
                direct()
                row["direct_ms"] = triton.testing.do_bench_cudagraph(direct)
                row["direct_max_abs"] = (out.float() - exact).abs().max().item()
                print(f"  direct (launch_config)                 {row['direct_ms']:8.3f} ms "
                      f"{flops / row['direct_ms'] / 1e9:6.0f} TFLOP/s  max-abs {row['direct_max_abs']:.3g}", flush=True)
            transformed = transformed_weight(weight, dtype)
            bound = padded.abs().amax().float()  # the fast op gives the norm's bound instead (no pass over x)
            if not args.core:
                _time_breakdown(row, padded, weight, bound, tiles)

            row["weight_transform_4_ms"] = triton.testing.do_bench_cudagraph(
                lambda: transformed_4_for(weight, refresh=False))
            print(f"  F(4x4, 3x3) weight points (in each F(4x4) time below) {row['weight_transform_4_ms']:8.3f} ms",
                  flush=True)

            def conv(p, o, tile):
                if tile.output_block == 4:  # as the op runs it: the points computed in the call, the scales kept
                    u, scales = transformed_4_for(weight, refresh=False)
                    large_tile.large_tile_conv3d(p, u, scales, bound, None, None, o, tile)
                else:
                    winograd.winograd_conv3d_channels_last(p, transformed, None, None, o, tile)

            with compile_ahead.compile_ahead() as ahead:  # every tile's kernel compiled in parallel first
                for tile in tiles if ahead else ():
                    try:
                        conv(padded, out, tile)
                    except Exception:  # noqa: BLE001 - the timed run below reports it
                        pass
            for tile in tiles:
                try:
                    def run(p=padded, o=out, tile=tile):
                        conv(p, o, tile)
                    run()
                    err = (out.float() - exact).abs().max().item()
                    ms = triton.testing.do_bench_cudagraph(run)
                except Exception as error:  # a tile this Triton cannot compile or run: say so and go on
                    print(f"  {tuple(tile)} failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
                    row["tiles"].append({"tile": list(tile), "error": f"{type(error).__name__}: {str(error)[:200]}"})
                    continue
                print(f"  winograd {str(tuple(tile)):<30} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  "
                      f"max-abs {err:.3g}  {row['cudnn_ms'] / ms:.2f}x cuDNN", flush=True)
                row["tiles"].append({"tile": list(tile), "ms": ms, "tflops": flops / ms / 1e9, "max_abs": err,
                                     "vs_cudnn": row["cudnn_ms"] / ms})
            results.append(row)
    if args.json:
        write_results(args.json, args.dtype, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
