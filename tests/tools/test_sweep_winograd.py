"""`sweep_winograd.winners`: which swept shapes become candidate table entries (CPU; no timing runs here)."""

import torch

from rewrite.kernels.winograd.common import WinogradTile
from rewrite.tools.sweep_winograd import winners

LARGE = list(WinogradTile(128, 128, 64, 8, 3, True, 0, False, True, 4))
WIDE = list(WinogradTile(128, 256, 64, 8, 3, True, 0, False, True, 4))


def _row(channels, plane, cudnn_ms, tiles, direct_ms=None):
    row = {"shape": "x", "channels": channels, "frames_height_width": plane, "cudnn_ms": cudnn_ms, "tiles": tiles}
    if direct_ms is not None:
        row["direct_ms"] = direct_ms
    return row


def test_the_fastest_tile_wins_where_it_beats_both_rivals_by_the_margin():
    sweep = {"dtype": "bfloat16", "results": [
        _row([1024, 512], [4, 180, 320], 2.0, [{"tile": LARGE, "ms": 1.5}, {"tile": WIDE, "ms": 1.2}], 1.9),
        _row([256, 256], [4, 240, 416], 2.0, [{"tile": LARGE, "ms": 1.0}], direct_ms=1.02),  # short of 1.05x direct
        _row([512, 512], [4, 120, 208], 2.0, [{"tile": LARGE, "error": "OutOfResources"}]),  # nothing timed
    ]}
    assert winners(sweep, 1.05) == {(1024, 512, 320, torch.bfloat16): WinogradTile(*WIDE)}


def test_rows_without_channels_are_skipped():
    """Sweeps written before the rows named their channels cannot be keyed."""
    sweep = {"dtype": "float16", "results": [{"shape": "x", "cudnn_ms": 9.0, "tiles": [{"tile": LARGE, "ms": 1.0}]}]}
    assert winners(sweep) == {}
