"""Probe (session 36, issue 40): `rewrite-bench` with a Winograd sweep's winners routed on the running card, before
they go into `winograd.common._MEASURED_FASTER`: each shape of a `sweep_winograd --json` file whose fastest tile
beat both cuDNN and the direct conv by the margin (`sweep_winograd.winners`) is added to this card's entries (those
already there are kept). Prints what it added, then runs the bench.

    python bench_with_winograd_winners.py SWEEP.json MARGIN -- REWRITE-BENCH ARGUMENTS...
"""
import json
import sys

import torch

from rewrite.kernels.winograd import common
from rewrite.tools import bench
from rewrite.tools.sweep_winograd import winners

sweep_path, margin = sys.argv[1], float(sys.argv[2])
bench_args = sys.argv[sys.argv.index("--") + 1:]
card = torch.cuda.get_device_name()
entries = common._MEASURED_FASTER.setdefault(card, {})
for key, tile in winners(json.load(open(sweep_path)), margin).items():
    print(f"{'kept' if key in entries else 'added'}: {key} {tuple(tile)}")
    entries.setdefault(key, tile)
sys.exit(bench.main(bench_args))
