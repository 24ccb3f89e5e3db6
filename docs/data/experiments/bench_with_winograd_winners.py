"""Probe (session 36, issue 40): `rewrite-bench` with a Winograd sweep's winners routed on the running card, before
they go into `winograd.common._MEASURED_FASTER`: each shape of a `sweep_winograd --json` file whose fastest tile
beat both cuDNN and the direct conv by the margin (`sweep_winograd.winners`) is added to this card's entries (those
already there are kept). Prints what it added, then runs the bench.

    python bench_with_winograd_winners.py SWEEP.json MARGIN -- REWRITE-BENCH ARGUMENTS...

Since session 37 the op computes F(4x4, 3x3)'s weight points on every call (`weight_store.transformed_4_for`; the
whole transform in session 37's run, its point scales kept since): for a sweep timed before that (its rows without
``weight_transform_4_ms``), that call is timed here per shape and added to each F(4x4, 3x3) tile's time before the
winners are chosen.
"""
import json
import sys

import torch
import triton.testing

from rewrite.kernels.winograd import common
from rewrite.kernels.winograd.weight_store import transformed_4_for
from rewrite.kernels.winograd.winograd import WinogradTile
from rewrite.tools import bench
from rewrite.tools.sweep_winograd import winners

sweep_path, margin = sys.argv[1], float(sys.argv[2])
bench_args = sys.argv[sys.argv.index("--") + 1:]
card = torch.cuda.get_device_name()
entries = common._MEASURED_FASTER.setdefault(card, {})
sweep = json.load(open(sweep_path))
for row in sweep["results"]:
    if "channels" in row and "weight_transform_4_ms" not in row:
        (cin, cout), dtype = row["channels"], getattr(torch, sweep["dtype"])
        weight = torch.randn(cout, cin, 3, 3, 3, device="cuda", dtype=dtype).contiguous(
            memory_format=torch.channels_last_3d)
        added = triton.testing.do_bench_cudagraph(lambda w=weight: transformed_4_for(w, refresh=False))
        for entry in row["tiles"]:
            if "ms" in entry and WinogradTile(*entry["tile"]).output_block == 4:
                entry["ms"] += added
        print(f"{row['shape']}: F(4x4, 3x3) weight transform {added:.3f} ms added to its tiles")
for key, tile in winners(sweep, margin).items():
    print(f"{'kept' if key in entries else 'added'}: {key} {tuple(tile)}")
    entries.setdefault(key, tile)
sys.exit(bench.main(bench_args))
