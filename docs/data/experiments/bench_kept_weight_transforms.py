"""Probe (session 37, issue 40): `rewrite-bench` with F(4x4, 3x3)'s weight transforms kept per weight, as they
were before session 37 (computed on a weight's first call, reused after), against the shipped op's (the points
computed in every call), to measure what the per-call points cost in a decode and what keeping them takes at the
peak.

    python bench_kept_weight_transforms.py -- REWRITE-BENCH ARGUMENTS...
"""
import sys

from rewrite.models.wan import ops_fast
from rewrite.tools import bench

_per_call = ops_fast.transformed_4_for
_kept = {}


def kept_transform(weight, refresh):
    """The weight's transform from its first call (the weights do not change during a bench)."""
    key = (weight.data_ptr(), tuple(weight.shape), weight.dtype)
    if key not in _kept:
        _kept[key] = _per_call(weight, refresh)
    return _kept[key]


ops_fast.transformed_4_for = kept_transform
sys.exit(bench.main(sys.argv[sys.argv.index("--") + 1:]))
