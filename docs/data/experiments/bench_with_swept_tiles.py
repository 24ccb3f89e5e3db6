"""Probe (session 31, issue 39): `rewrite-bench` with a conv sweep's winners given to the running card, before
they go into its tables: for each shape of a `sweep_conv3d --json` file whose best tile beats cuDNN by the given
margin, that tile goes into `conv3d.CARD_TILES` and the conv into `CARD_FASTER_THAN_CUDNN` for this card (the
shape's channels and width from the sweep's own `SHAPES`; 3x3x3 convs only). Prints what it added, then runs the
bench.

    python bench_with_swept_tiles.py SWEEP.json MARGIN -- REWRITE-BENCH ARGUMENTS...
"""
import json
import sys

import torch

from rewrite.kernels.conv3d import conv3d
from rewrite.tools import bench
from rewrite.tools.sweep_conv3d import K3, SHAPES

sweep_path, margin = sys.argv[1], float(sys.argv[2])
bench_args = sys.argv[sys.argv.index("--") + 1:]
card = torch.cuda.get_device_name()
convs = {name: (cin, cout, w) for family in SHAPES.values() for name, cin, cout, _, _, w, kernel in family
         if kernel == K3}
for row in json.load(open(sweep_path))["results"]:
    if not row.get("tiles") or row["shape"] not in convs:
        continue
    best = min(row["tiles"], key=lambda t: t["ms"])
    in_channels, out_channels, width = convs[row["shape"]]
    ratio = row["cudnn_ms"] / best["ms"]
    if ratio < 1 + margin:
        print(f"kept cuDNN: {row['shape']} (best tile {ratio:.2f}x)")
        continue
    tile = conv3d.ConvTile(*best["tile"])
    conv3d.CARD_TILES.setdefault(card, {})[(in_channels, out_channels, width)] = tile
    conv3d.CARD_FASTER_THAN_CUDNN[card] = conv3d.CARD_FASTER_THAN_CUDNN.get(card, frozenset()) | {
        (in_channels, out_channels, 27, width)}
    print(f"added: {row['shape']} {ratio:.2f}x with {tuple(tile)}")
sys.exit(bench.main(bench_args))
