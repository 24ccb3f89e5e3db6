#!/usr/bin/env bash
# Written in session 39 (issue 40), for the H100 after Wan 2.1's eight sweep winners joined the routed table (the
# 720p and 1080p decodes with them: gpu_winograd_shipped_table_checks.sh): the per-layer GPU test of every table
# shape, the full-size Wan 2.1 contract tests (480p, 720p; fp16 and fp32 too), and Wan 2.1 480x832x81 `off` against
# `channels_last` (its 416- and 208-wide entries had no decode yet). About 5 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 100 python3 -m pytest -m gpu -q tests/kernels/winograd/test_large_tile.py -k every_routed 2>&1 | tail -3 \
  | tee $OUT/routed_shapes_test.log
timeout 200 python3 -m pytest -m gpu -q tests/models/wan/test_full_size_channels_last.py -k "wan2.1 or fp16" 2>&1 \
  | tail -3 | tee $OUT/full_size_wan21.log
timeout 120 rewrite-bench --model wan2.1 --size 480x832 --frames 81 --repeat 2 --levels off,channels_last \
  --json $OUT/wan21_480x832x81_promoted_${card}.json 2>&1 | grep -v Warn | grep -v decodes | tail -12
