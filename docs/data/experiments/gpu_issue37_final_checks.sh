#!/usr/bin/env bash
# Written in session 39 (issues 37, 40), on the routing as of 09f30aa (Winograd table ahead of the direct conv).
# Part 1 (about 6 minutes): the per-layer GPU test of every F(4x4, 3x3) table shape, then Wan 2.1 1088x1920x81 at
# `off`, `lossless`, `channels_last` (issue 37's 1080p row: `lossless` >= 2.0x, `channels_last` >= 3.3x, peaks).
# Part 2 (`part2` argument, about 7 minutes): issue 37's GPU tests (memory back after `del` / `off`, shared pool,
# forced out of memory, 1088x1920 bit-identical). Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
if [ "$1" = part2 ]; then
  timeout 280 python3 -m pytest -m gpu -q tests/runtime/test_full_size_memory.py 2>&1 | tail -4 | tee $OUT/memory_tests.log
  timeout 250 python3 -m pytest -m gpu -q tests/models/wan/test_full_size_decodes.py -k "1080p and wan2.1" 2>&1 \
    | tail -4 | tee $OUT/bit_identical_1080p.log
  exit 0
fi
timeout 120 python3 -m pytest -m gpu -q tests/kernels/winograd/test_large_tile.py -k every_routed 2>&1 | tail -4 \
  | tee $OUT/routed_shapes_test.log
timeout 330 rewrite-bench --model wan2.1 --size 1088x1920 --frames 81 --repeat 2 --levels off,lossless,channels_last \
  --json $OUT/wan21_1088x1920x81_${card}.json 2>&1 | grep -v Warn | grep -v decodes | tail -5
