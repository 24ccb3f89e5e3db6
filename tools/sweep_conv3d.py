"""Time the Triton conv3d (`rewrite.kernels.conv3d.conv3d`) against cuDNN's channels-last conv per Wan conv shape.

For each Wan 2.1 / 2.2 3x3x3 conv shape of a 720p steady step (docs/tuning.md section 1) and each candidate
tile, run ``conv3d_channels_last`` on a padded channels-last input and cuDNN's conv of the same operands
(channels-last input and weight, no bias: the `lossless` path), time both with
``triton.testing.do_bench_cudagraph`` (median GPU time), and report TFLOP/s and the max-abs difference
against cuDNN's output. This is the sweep that `triton_conv3d.launch_config` and `chosen` are read from;
needs CUDA (``--help`` works anywhere).

    python -m rewrite.tools.sweep_conv3d [--dtype bfloat16] [--shapes wan21] [--json out.json]

``--shapes wan22up`` times Wan 2.2's up-block ends instead (the upsampler's conv by phases, `_up_block_end`).
"""

from __future__ import annotations

import argparse
import json
import sys

# (name, in channels, out channels, output frames, height, width, kernel); a (1, 3, 3) kernel is an upsampler's
# conv2d over the frames, which cuDNN runs as conv2d with its own zero padding (the `lossless` path)
K3 = (3, 3, 3)
K2 = (1, 3, 3)
SHAPES = {
    "wan21": [("96 @ 4x720x1280", 96, 96, 4, 720, 1280, K3), ("192 @ 4x360x640", 192, 192, 4, 360, 640, K3),
              ("384 @ 2x180x320", 384, 384, 2, 180, 320, K3), ("384 @ 1x90x160", 384, 384, 1, 90, 160, K3),
              ("192->384 @ 2x180x320", 192, 384, 2, 180, 320, K3)],
    "wan21_480": [("96 @ 4x480x832", 96, 96, 4, 480, 832, K3), ("192 @ 4x240x416", 192, 192, 4, 240, 416, K3),
                  ("384 @ 2x120x208", 384, 384, 2, 120, 208, K3), ("384 @ 1x60x104", 384, 384, 1, 60, 104, K3),
                  ("192->384 @ 2x120x208", 192, 384, 2, 120, 208, K3)],
    "wan21_1080": [("96 @ 4x1088x1920", 96, 96, 4, 1088, 1920, K3), ("192 @ 4x544x960", 192, 192, 4, 544, 960, K3),
                   ("384 @ 2x272x480", 384, 384, 2, 272, 480, K3), ("384 @ 1x136x240", 384, 384, 1, 136, 240, K3),
                   ("192->384 @ 2x272x480", 192, 384, 2, 272, 480, K3),
                   ("head 96->3 @ 4x1088x1920", 96, 3, 4, 1088, 1920, K3)],
    "wan21enc": [("96->192 @ 4x360x640", 96, 192, 4, 360, 640, K3), ("96->192 @ 4x240x416", 96, 192, 4, 240, 416, K3)],
    "wan22enc": [("160 @ 4x352x640", 160, 160, 4, 352, 640, K3), ("160->320 @ 4x176x320", 160, 320, 4, 176, 320, K3),
                 ("320 @ 4x176x320", 320, 320, 4, 176, 320, K3), ("320->640 @ 2x88x160", 320, 640, 2, 88, 160, K3),
                 ("640 @ 2x88x160", 640, 640, 2, 88, 160, K3)],
    "head": [("head 96->3 @ 4x720x1280", 96, 3, 4, 720, 1280, K3), ("head 96->3 @ 4x480x832", 96, 3, 4, 480, 832, K3),
             ("head 256->12 @ 4x360x640", 256, 12, 4, 360, 640, K3)],
    "wan21up": [("up 192->96 @ 4x720x1280", 192, 96, 4, 720, 1280, K2),
                ("up 384->192 @ 4x360x640", 384, 192, 4, 360, 640, K2)],
    "wan22": [("1024 @ 2x90x160", 1024, 1024, 2, 90, 160, K3), ("512 @ 4x180x320", 512, 512, 4, 180, 320, K3),
              ("256 @ 4x360x640", 256, 256, 4, 360, 640, K3)],
    # the rest of Wan 2.2's 720p decoder convs (mid block, the channel-halving resnets) and its 480p planes
    "wan22_more": [("1024 @ 1x45x80", 1024, 1024, 1, 45, 80, K3), ("1024->512 @ 4x180x320", 1024, 512, 4, 180, 320, K3),
                   ("512->256 @ 4x360x640", 512, 256, 4, 360, 640, K3)],
    "wan22_480": [("1024 @ 1x30x52", 1024, 1024, 1, 30, 52, K3), ("1024 @ 2x60x104", 1024, 1024, 2, 60, 104, K3),
                  ("512 @ 4x120x208", 512, 512, 4, 120, 208, K3), ("1024->512 @ 4x120x208", 1024, 512, 4, 120, 208, K3),
                  ("256 @ 4x240x416", 256, 256, 4, 240, 416, K3), ("512->256 @ 4x240x416", 512, 256, 4, 240, 416, K3)],
}
# Wan 2.2's up-block ends at 720p and 480p (a steady step): (name, in = out channels, source frames, source height, width,
# the block input's channels, its frames, the DupUp3D time factor), timed as the ``lossless`` op and by phases
UP_BLOCK_ENDS = {
    "wan22up": [("up-end 1024 @ 2x45x80", 1024, 2, 45, 80, 1024, 1, 2),
                ("up-end 1024 @ 4x90x160", 1024, 4, 90, 160, 1024, 2, 2),
                ("up-end 512 @ 4x180x320", 512, 4, 180, 320, 1024, 4, 1)],
    "wan22up_480": [("up-end 1024 @ 2x30x52", 1024, 2, 30, 52, 1024, 1, 2),
                    ("up-end 1024 @ 4x60x104", 1024, 4, 60, 104, 1024, 2, 2),
                    ("up-end 512 @ 4x120x208", 512, 4, 120, 208, 1024, 4, 1)],
}


def _arrangements(width: int, pixels: int):
    """(rows, block_w) ways to hold `pixels` output pixels: `pixel_tile`'s choice first, then one row and two
    rows where they differ from it (rows of 64 pixels or more)."""
    from rewrite.kernels.conv3d.conv3d import pixel_tile

    found = [pixel_tile(width, pixels)]
    for rows in (1, 2):
        if pixels // rows >= 64 and (rows, pixels // rows) not in found:
            found.append((rows, pixels // rows))
    return found


def _split_families(out_channels: int) -> list:
    """Program shapes holding every one of `out_channels` that is not a power of two in one program, as the
    largest power of two below it plus a power-of-two rest (Wan 2.2's encoder: 160 = 128 + 32, 320 = 256 + 64),
    where the first is at most 256; then 64-channel blocks where they divide the count (320 = 5 x 64). Tried
    first: whole 128-channel blocks leave 160 channels' programs 37.5% idle (docs/tuning.md 1.22)."""
    families = []
    block_n = 1 << (out_channels.bit_length() - 1)
    rest = out_channels - block_n
    if 16 <= rest and rest & (rest - 1) == 0 and block_n <= 256:
        families += [(128, block_n, rest, 8, 3), (128, block_n, rest, 8, 4), (64, block_n, rest, 4, 3),
                     (64, block_n, rest, 8, 3)]
    if out_channels % 128 and out_channels % 64 == 0:
        families += [(128, 64, 0, 4, 4), (256, 64, 0, 8, 3)]
    return families


def candidate_tiles(in_channels: int, out_channels: int, width: int, warp_specialize: bool = False):
    """The tiles the sweep tries for a shape, `launch_config`'s first (ConvTile fields: block_w, block_n,
    block_k, warps, stages, n_rest, rows, warp_specialize, max_registers, flat). Each (pixels, channels, warps,
    stages) family is tried in `_arrangements`' pixel layouts, and flat where those compute pixels past the row
    ends and a program fits in two rows (`tile_reason`). Warp-specialized tiles only on request: on the H200 with Triton
    3.6 the first one had not finished compiling after minutes (docs/tuning.md section 1)."""
    from rewrite.kernels.conv3d.conv3d import MIN_OUT_CHANNELS, ConvTile, launch_config, tile_reason, wasted_fraction

    k = 64 if in_channels % 64 == 0 else 32
    families = []  # (pixels, block_n, n_rest, warps, stages)
    if out_channels == 96:
        families += [(256, 64, 32, 8, 4), (256, 64, 32, 8, 3), (128, 64, 32, 4, 3), (128, 64, 32, 8, 4)]
    elif out_channels < MIN_OUT_CHANNELS:  # a head: 16-channel tiles
        families += [(256, 16, 0, 8, 4), (256, 16, 0, 8, 3), (256, 16, 0, 4, 4), (128, 16, 0, 4, 4), (128, 16, 0, 4, 3),
                     (64, 16, 0, 4, 4)]
    elif out_channels == 192:
        families += [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (64, 128, 64, 4, 3), (256, 64, 0, 8, 4),
                     (128, 64, 0, 4, 4), (128, 128, 0, 4, 4)]
    else:
        families += _split_families(out_channels)
        families += [(128, 128, 0, 4, 4), (128, 128, 0, 4, 3), (128, 128, 0, 8, 4), (256, 128, 0, 8, 3),
                     (128, 256, 0, 8, 3)]
    tiles = [launch_config(in_channels, out_channels, width)]
    for pixels, block_n, n_rest, warps, stages in families:
        for rows, block_w in _arrangements(width, pixels):
            tile = ConvTile(block_w, block_n, k, warps, stages, n_rest, rows)
            if tile not in tiles:
                tiles.append(tile)
        flat = ConvTile(pixels, block_n, k, warps, stages, n_rest, 1, flat=True)
        rows_waste = min(wasted_fraction(ConvTile(w, block_n, k, warps, stages, n_rest, r), width)
                         for r, w in _arrangements(width, pixels))
        if flat not in tiles and rows_waste > 0 and tile_reason(flat, out_channels, width + 2) is None:
            tiles.append(flat)
    if warp_specialize:
        tiles += [tile._replace(warp_specialize=True) for tile in tiles[:2]]
    return tiles


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--shapes", default="wan21,wan21_480,wan21up,wan22",
                        help=f"comma-separated: {', '.join([*SHAPES, *UP_BLOCK_ENDS])}")
    parser.add_argument("--max-tiles", type=int, default=None, help="try only the first N candidate tiles")
    parser.add_argument("--only", default=None, help="only the shapes whose name starts with one of these (comma-separated)")
    parser.add_argument("--decode-epilogues", action="store_true",
                        help="also time the launch_config tile with the decode's outputs: NCDHW, and NCDHW with "
                             "bias and an NCDHW residual (a resnet's second conv)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--warp-specialize", action="store_true", help="also try warp-specialized tiles")
    args = parser.parse_args(argv)
    import torch
    import triton.testing

    from rewrite.ops import compile_ahead
    from rewrite.kernels.conv3d import conv3d as triton_conv3d

    if not torch.cuda.is_available():
        print("sweep_conv3d: needs CUDA", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    cl = torch.channels_last_3d
    results = []
    for family in args.shapes.split(","):
        for name, *shape in UP_BLOCK_ENDS.get(family, ()):
            if not args.only or name.startswith(tuple(args.only.split(","))):
                results.append({"shape": name, "up_block_end": _up_block_end(triton, *shape, dtype)})
        for name, cin, cout, t, h, w, kernel in SHAPES.get(family, ()):
            if args.only and not name.startswith(tuple(args.only.split(","))):
                continue
            torch.manual_seed(0)
            kt, kh, kw = kernel
            padded = torch.randn(1, cin, t + kt - 1, h + kh - 1, w + kw - 1, device="cuda", dtype=dtype).contiguous(
                memory_format=cl)
            weight = (torch.randn(cout, cin, *kernel, device="cuda", dtype=dtype) / (kt * kh * kw * cin) ** 0.5
                      ).contiguous(memory_format=cl)
            flops = 2 * cout * cin * kt * kh * kw * t * h * w
            reference = torch.ops.aten.conv3d.default(padded, weight, None)
            if kt == 1:  # the lossless path: cuDNN's conv2d of the unpadded frames, its own zero pad
                frames = padded[:, :, :, 1:-1, 1:-1].permute(0, 2, 1, 3, 4).reshape(t, cin, h, w).contiguous(
                    memory_format=torch.channels_last)
                weight2d = weight[:, :, 0].contiguous(memory_format=torch.channels_last)

                def cudnn(x=frames, wt=weight2d):
                    return torch.ops.aten.conv2d.default(x, wt, None, [1, 1], [1, 1])
            else:
                def cudnn(x=padded, wt=weight):
                    return torch.ops.aten.conv3d.default(x, wt, None)
            ms = triton.testing.do_bench_cudagraph(cudnn)
            row = {"shape": name, "cudnn_ms": ms, "cudnn_tflops": flops / ms / 1e9, "tiles": []}
            print(f"{name:<24} cudnn {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s", flush=True)
            out = torch.empty(reference.shape, device="cuda", dtype=dtype).contiguous(memory_format=cl)
            tiles = candidate_tiles(cin, cout, w, args.warp_specialize)[:args.max_tiles]
            with compile_ahead.compile_ahead() as ahead:  # every tile's kernel compiled in parallel first
                for tile in tiles if ahead else ():
                    try:
                        triton_conv3d.conv3d_channels_last(padded, weight, None, None, out, config=tile)
                    except Exception:  # noqa: BLE001 - the timed run below reports it
                        pass
            for tile in tiles:
                try:
                    def run(p=padded, wt=weight, o=out, tile=tile):
                        triton_conv3d.conv3d_channels_last(p, wt, None, None, o, config=tile)
                    run()
                    err = (out.float() - reference.float()).abs().max().item()
                    ms = triton.testing.do_bench_cudagraph(run)
                except Exception as error:  # a tile this Triton cannot compile: say so and go on
                    print(f"  {tuple(tile)} failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
                    row["tiles"].append({"tile": list(tile), "error": f"{type(error).__name__}: {str(error)[:200]}"})
                    continue
                print(f"  {str(tuple(tile)):<40} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  max-abs {err:.3g}",
                      flush=True)
                row["tiles"].append({"tile": list(tile), "ms": ms, "tflops": flops / ms / 1e9, "max_abs": err})
            if kt == 1:
                row["phases"] = _upsample_phases(triton, cin, cout, t, h // 2, w // 2, dtype)
            if cout < triton_conv3d.MIN_OUT_CHANNELS:
                row["folded"] = _folded(triton, triton_conv3d, padded, weight, reference, flops)
            if args.decode_epilogues:
                timed = [t for t in row["tiles"] if "ms" in t]
                best = triton_conv3d.ConvTile(*min(timed, key=lambda t: t["ms"])["tile"]) if timed else None
                row["decode_epilogues"] = _decode_epilogues(triton, triton_conv3d, padded, weight, reference, flops,
                                                            best)
            results.append(row)
    if args.json:
        write_results(args.json, args.dtype, results)
    return 0


def write_results(path: str, dtype: str, results: list) -> None:
    """A sweep's results as JSON, with the dtype, torch version and GPU they were measured with."""
    import torch

    with open(path, "w") as f:
        json.dump({"dtype": dtype, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                   "results": results}, f, indent=1)


def _epilogue_tiles(triton_conv3d, in_channels: int, out_channels: int, width: int, best=None) -> list:
    """`launch_config`'s tile, the sweep's fastest plain tile (`best`) where it differs, and each capped at 128
    registers per thread where one program holds every output channel (ptxas spills the rest: two programs fit
    an SM with the fused norm; docs/tuning.md section 1.6)."""
    tiles = [triton_conv3d.launch_config(in_channels, out_channels, width)]
    if best is not None and best not in tiles:
        tiles.append(best)
    for tile in list(tiles):
        if triton_conv3d.norm_epilogue_reason(out_channels, tile) is None and tile.max_registers is None:
            tiles.append(tile._replace(max_registers=128))
    return tiles


def _decode_epilogues(triton, triton_conv3d, padded, weight, reference, flops, best=None) -> dict:
    """ms of each `_epilogue_tiles` tile writing a contiguous (NCDHW) output, without and with bias + residual
    (NCDHW too), and (3x3x3, all channels in one program) the fused norm into the next conv's input."""
    import torch

    out = torch.empty(reference.shape, device="cuda", dtype=padded.dtype)
    residual = torch.randn(reference.shape, device="cuda", dtype=padded.dtype)
    bias = torch.randn(reference.shape[1], device="cuda", dtype=padded.dtype)
    timings = {}
    for tile in _epilogue_tiles(triton_conv3d, weight.shape[1], weight.shape[0], reference.shape[4], best):
        for name, extra in (("ncdhw", (None, None)), ("ncdhw+bias+residual", (bias, residual))):
            def run(extra=extra, tile=tile):
                triton_conv3d.conv3d_channels_last(padded, weight, extra[0], extra[1], out, config=tile)
            run()
            expected = reference.float() if extra[0] is None else (reference.float() + bias.float().view(-1, 1, 1, 1)
                                                                   + residual.float())
            err = (out.float() - expected).abs().max().item()
            ms = triton.testing.do_bench_cudagraph(run)
            timings[f"{tuple(tile)} {name}"] = ms
            print(f"  {str(tuple(tile)):<36} {name:<22} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  max-abs {err:.3g}",
                  flush=True)
        if (weight.shape[2] == 3 and weight.shape[0] >= triton_conv3d.MIN_OUT_CHANNELS
                and triton_conv3d.norm_epilogue_reason(weight.shape[0], tile) is None):
            timings.update(_norm_epilogue(triton, triton_conv3d, padded, weight, bias, flops, tile))
    return timings


def _upsample_phases(triton, cin: int, cout: int, frames: int, h: int, w: int, dtype) -> dict:
    """ms of the upsampler's conv of a 2x nearest upsample (bias, NCHW frames in and out) as the ``lossless``
    op runs it (upsample kernel, cuDNN's conv, bias epilogue) and as ``upsample_conv2d_fast`` does (a padded
    copy of the source, four 2x2 phase convs: docs/tuning.md section 1.11)."""
    import torch

    from rewrite.kernels.conv3d import conv3d as triton_conv3d  # noqa: F401  (wan: registers the ops)
    from rewrite.models.wan import ops as wan  # noqa: F401  (wan: registers the ops)
    from rewrite.models.wan import upsample_fast as wan_upsample_fast  # noqa: F401  (wan: registers the ops)

    x = torch.randn(frames, cin, h, w, device="cuda", dtype=dtype)
    weight = (torch.randn(cout, cin, 3, 3, device="cuda", dtype=dtype) / (9 * cin) ** 0.5)
    bias = torch.randn(cout, device="cuda", dtype=dtype)
    flops = 2 * cout * cin * 9 * frames * 4 * h * w  # of the upsampled conv
    timings = {}
    runs = {"lossless op": torch.ops.rewrite.upsample_conv2d.default,
            "phases op": torch.ops.rewrite.upsample_conv2d_fast.default}
    outputs = {}
    for name, op in runs.items():
        def run(op=op):
            return op(x, True, weight, bias, [1, 1], [1, 1])
        outputs[name] = run()
        ms = triton.testing.do_bench_cudagraph(run)
        timings[name] = ms
        print(f"  {name:<58} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s (upsampled conv's)", flush=True)
    err = (outputs["lossless op"].float() - outputs["phases op"].float()).abs().max().item()
    print(f"  max-abs between them {err:.3g}", flush=True)
    timings["max_abs"] = err
    # the cuDNN phase conv (Wan 2.2's up-block ends' path) with its gathering bias epilogue, for comparison
    from rewrite.kernels.epilogue import epilogue as triton_epilogue
    strides = outputs["phases op"].unsqueeze(2).stride()

    def cudnn_phases():
        y = wan_upsample_fast.phase_conv(x, weight).unsqueeze(2)
        return triton_epilogue.conv_epilogue(y, bias, None, strides, phases=True)
    ms = triton.testing.do_bench_cudagraph(cudnn_phases)
    timings["cuDNN phases"] = ms
    print(f"  {'cuDNN phase conv + gathering epilogue':<58} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s, max-abs "
          f"{(cudnn_phases().squeeze(2).float() - outputs['lossless op'].float()).abs().max().item():.3g}", flush=True)
    # the phase kernels alone (the padded source made once), per tile: their K loop is 4 taps long, so the
    # epilogue's share is larger than in a 27-tap conv and tiles with two programs per SM may win
    padded = wan_upsample_fast.padded_source(x)
    out = torch.empty_like(outputs["phases op"])
    k = 64 if cin % 64 == 0 else 32
    if cout == 96:
        tiles = [(256, 64, k, 8, 4, 32, 1), (128, 64, k, 8, 4, 32, 2), (128, 64, k, 4, 3, 32, 1),
                 (64, 64, k, 4, 3, 32, 2), (128, 64, k, 4, 4, 32, 1), (128, 64, k, 8, 3, 32, 1)]
    else:
        tiles = [(64, 128, k, 8, 3, 64, 2), (128, 128, k, 8, 3, 64, 1), (64, 128, k, 4, 3, 64, 2),
                 (128, 128, k, 4, 3, 64, 1), (64, 128, k, 8, 4, 64, 2)]
    for fields in tiles:
        tile = triton_conv3d.ConvTile(*fields)

        def phases(tile=tile):
            triton_conv3d.upsample2x_conv2d_channels_last(padded, weight, bias, out, config=tile)
        try:
            phases()
            ms = triton.testing.do_bench_cudagraph(phases)
        except Exception as error:  # noqa: BLE001 - a tile this Triton cannot compile: say so and go on
            print(f"  phases {fields} failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
            continue
        timings[f"phases {fields}"] = ms
        print(f"  phases {str(fields):<50} {ms:8.3f} ms", flush=True)
    return timings


def _up_block_end(triton, channels: int, frames: int, h: int, w: int, block_channels: int, block_frames: int,
                  factor_t: int, dtype) -> dict:
    """ms of a Wan 2.2 up-block end (the upsampler's conv of a 2x nearest upsample, bias, plus the DupUp3D
    shortcut of the block input) as the ``lossless`` op runs it and as ``upsample_conv2d_dup_up_add_fast`` does
    (cuDNN's phase conv and the gathering epilogue: docs/tuning.md section 1.12), for the source frames in
    NCDHW memory and channels-last; and cuDNN's 3x3 conv of the upsampled frames against the phase conv."""
    import torch

    from rewrite.models.wan import upsample_fast as wan_upsample_fast

    cl = torch.channels_last
    source = torch.randn(1, channels, frames, h, w, device="cuda", dtype=dtype)
    dx = torch.randn(1, block_channels, block_frames, h, w, device="cuda", dtype=dtype)
    weight = torch.randn(channels, channels, 3, 3, device="cuda", dtype=dtype) / (9 * channels) ** 0.5
    bias = torch.randn(channels, device="cuda", dtype=dtype)
    repeats = channels * factor_t * 4 // block_channels
    scalars = ([1, 1], [1, 1], [1, frames, channels, 2 * h, 2 * w], dx, repeats,
               [1, channels, factor_t, 2, 2, block_frames, h, w], [1, channels, block_frames * factor_t, 2 * h, 2 * w],
               0)
    flops = 2 * channels * channels * 9 * frames * 4 * h * w  # of the upsampled conv
    timings = {}
    print(f"up-block end {channels} @ {frames}x{h}x{w} (source)", flush=True)
    for layout, x in (("ncdhw", source[0].transpose(0, 1)), ("channels_last", source[0].transpose(0, 1).contiguous(
            memory_format=cl))):
        outputs = {}
        for name, op in (("lossless op", torch.ops.rewrite.upsample_conv2d_dup_up_add.default),
                         ("phases op", torch.ops.rewrite.upsample_conv2d_dup_up_add_fast.default)):
            def run(op=op, x=x):
                return op(x, True, weight, bias, *scalars)
            outputs[name] = run()
            ms = triton.testing.do_bench_cudagraph(run)
            timings[f"{name} {layout}"] = ms
            print(f"  {name} ({layout} source){'':<30} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s (upsampled "
                  f"conv's)", flush=True)
        err = (outputs["lossless op"].float() - outputs["phases op"].float()).abs().max().item()
        timings[f"max_abs {layout}"] = err
        print(f"  max-abs between them {err:.3g}", flush=True)
    x = source[0].transpose(0, 1).contiguous(memory_format=cl)
    upsampled = torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest").contiguous(memory_format=cl)
    weight_cl = weight.contiguous(memory_format=cl)
    for name, run in (("cuDNN 3x3 of the upsample", lambda: torch.ops.aten.conv2d.default(upsampled, weight_cl, None,
                                                                                            [1, 1], [1, 1])),
                      ("cuDNN phase conv", lambda: wan_upsample_fast.phase_conv(x, weight))):
        ms = triton.testing.do_bench_cudagraph(run)
        timings[name] = ms
        print(f"  {name:<48} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s (upsampled conv's)", flush=True)
    return timings


def _folded(triton, triton_conv3d, padded, weight, reference, flops) -> dict:
    """ms of `conv3d_channels_last_folded` (a narrow conv's kernel taps folded into its output channels: kw, or
    kh and kw) with bias into an NCDHW output, per inner tile (the decode's head: docs/tuning.md section 1.10)."""
    import torch

    out = torch.empty(reference.shape, device="cuda", dtype=padded.dtype)
    bias = torch.randn(reference.shape[1], device="cuda", dtype=padded.dtype)
    expected = reference.float() + bias.float().view(-1, 1, 1, 1)
    cout, cin, _, kh, kw = weight.shape
    k = 64 if cin % 64 == 0 else 32
    timings = {}
    for fold, folded_out in ((1, kw * cout), (2, kh * kw * cout)):
        block_n = max(triton_conv3d.MIN_OUT_CHANNELS, triton.next_power_of_2(folded_out))
        width = padded.shape[4]  # the partial sums cover every padded column
        tiles = []
        for pixels, warps, stages in ((256, 8, 4), (256, 8, 3), (256, 4, 4), (128, 4, 4), (128, 4, 3)):
            for rows, block_w in _arrangements(width, pixels):
                tile = triton_conv3d.ConvTile(block_w, block_n, k, warps, stages, 0, rows)
                if tile not in tiles:
                    tiles.append(tile)
        for tile in tiles:
            def run(tile=tile, fold=fold):
                triton_conv3d.conv3d_channels_last_folded(padded, weight, bias, None, out, fold=fold, config=tile)
            try:
                run()
                err = (out.float() - expected).abs().max().item()
                ms = triton.testing.do_bench_cudagraph(run)
            except Exception as error:  # noqa: BLE001 - a tile this Triton cannot compile: say so and go on
                print(f"  folded {fold} {tuple(tile)} failed: {type(error).__name__}: {str(error)[:200]}", flush=True)
                continue
            timings[f"fold {fold} {tuple(tile)}"] = ms
            print(f"  folded {fold} {str(tuple(tile)):<36} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  "
                  f"max-abs {err:.3g}", flush=True)
    return timings


def _norm_epilogue(triton, triton_conv3d, padded, weight, bias, flops, tile) -> dict:
    """ms of a block's first conv feeding the second conv's padded input (steady: 2 cache frames, zero pad),
    as the pair op does it (the norm in the conv's epilogue) and as two fast ops do (a raw channels-last
    output, then the lossless norm kernel adding the deferred bias)."""
    import torch

    from rewrite.kernels import layout
    from rewrite.kernels.norm import rms_norm as triton_norm
    from rewrite.kernels.norm import one_pass as triton_norm_fast
    from rewrite.kernels.pad import causal_pad as triton_pad

    b, o, t, h, w = padded.shape[0], weight.shape[0], padded.shape[2] - 2, padded.shape[3] - 2, padded.shape[4] - 2
    cl = torch.channels_last_3d
    y = torch.empty((b, o, t, h, w), device="cuda", dtype=padded.dtype, memory_format=cl)
    cache = torch.randn((b, o, 2, h, w), device="cuda", dtype=padded.dtype).contiguous(memory_format=cl)
    gamma = 1 + 0.1 * torch.randn(o, 1, 1, 1, device="cuda", dtype=padded.dtype)
    pad, scale = [1, 1, 1, 1, 0, 0], o ** 0.5
    plan = layout.norm_plan(y, True, reference_contiguous=True)

    def fused():
        nxt, nxt_cache = triton_pad.causal_pad_rest_channels_last(y, cache, pad)
        triton_conv3d.conv3d_channels_last_norm_padded(padded, weight, bias, gamma, scale, 0.0, 1e-12, True, nxt,
                                                       nxt_cache, pad, 2, config=tile)
        return nxt

    def two_ops():
        triton_conv3d.conv3d_channels_last(padded, weight, None, None, y, config=tile)
        return triton_norm.rms_norm_padded_channels_last(y, gamma, scale, 0.0, 1e-12, True, True, plan.split, cache, pad,
                                                         plan.ctas, x_bias=bias)[0]

    # a block's second conv (bias + residual) whose output is the next block's input and shortcut: its output
    # stored and normalized into the next block's padded input in one epilogue (the chain op), or stored, then
    # normalized by the one-pass kernel (the pair op, then the next one's norm)
    residual = torch.randn((b, o, t, h, w), device="cuda", dtype=padded.dtype)
    out = torch.empty_like(residual)

    def chained():
        nxt, nxt_cache = triton_pad.causal_pad_rest_channels_last(out, cache, pad)
        triton_conv3d.conv3d_channels_last_norm_padded(padded, weight, bias, gamma, scale, 0.0, 1e-12, True, nxt,
                                                       nxt_cache, pad, 2, config=tile, residual=residual, out=out)
        return nxt

    def unchained():
        triton_conv3d.conv3d_channels_last(padded, weight, bias, residual, out, config=tile._replace(max_registers=None))
        return triton_norm_fast.rms_norm_padded_one_pass(out, gamma, scale, 0.0, 1e-12, True, cache, pad, None)[0]

    timings = {}
    for (name, run), (first, second) in zip(
            (("norm into next input", fused), ("raw + norm kernel", two_ops), ("residual: chained", chained),
             ("residual: + one-pass", unchained)), ((fused, two_ops),) * 2 + ((chained, unchained),) * 2):
        err = (first().float() - second().float()).abs().max().item()
        ms = triton.testing.do_bench_cudagraph(run)
        timings[f"{tuple(tile)} {name}"] = ms
        print(f"  {str(tuple(tile)):<36} {name:<22} {ms:8.3f} ms {flops / ms / 1e9:6.0f} TFLOP/s  max-abs {err:.3g}",
              flush=True)
    return timings


if __name__ == "__main__":
    sys.exit(main())
