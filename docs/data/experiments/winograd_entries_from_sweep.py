"""Session 35 (issue 40): the Winograd table entries a sweep's JSON argues for, then a decode with them routed.

    python winograd_entries_from_sweep.py SWEEP.json [bench arguments...]

For each square shape of the sweep ("C @ TxHxW"), the fastest tile of any Winograd form is taken where it beats
cuDNN by at least 5% (the direct conv is not chosen at Wan 2.2's widths); those entries replace the card's table
(`winograd.common._MEASURED_FASTER`) for this process only, and `rewrite-bench` runs with the remaining arguments:
the decode that decides whether an entry ships (speed and the `channels_last` contract against `off`).
"""

import json
import sys

import torch

from rewrite.kernels.winograd import common
from rewrite.tools.bench import main

sweep = json.load(open(sys.argv[1]))
entries = {}
for row in sweep["results"]:
    name = row["shape"]
    if "->" in name or "head" in name:
        continue
    channels = int(name.split()[0])
    width = int(name.split("x")[-1])
    timed = [tile for tile in row["tiles"] if "ms" in tile]
    if not timed:
        continue
    best = min(timed, key=lambda tile: tile["ms"])
    if best["vs_cudnn"] >= 1.05:
        entries[(channels, channels, width, torch.bfloat16)] = common.WinogradTile(*best["tile"])
        print(f"routed: {name} {best['tile']} {best['vs_cudnn']:.2f}x cuDNN", flush=True)
common._MEASURED_FASTER[sweep["gpu"]] = entries
sys.exit(main(sys.argv[2:]))
