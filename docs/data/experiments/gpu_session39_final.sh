#!/usr/bin/env bash
# Written in session 39 (issues 37, 40), on the final code (Wan 2.1's eight Winograd entries routed, the op's one
# route lookup): issue 37's memory tests (memory back after `del` / `off`, shared pool, forced out of memory), then
# on an H100 Wan 2.1 720x1280x81 `off` / `channels_last`; on an H200 the F(4x4, 3x3) sweep of Wan 2.2's convs
# (core timings; it has no table yet). About 5 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 200 python3 -m pytest -m gpu -q tests/runtime/test_full_size_memory.py 2>&1 | tail -3 | tee $OUT/memory_tests.log
if [ "$card" = h100 ]; then
  timeout 150 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --repeat 2 --levels off,channels_last \
    --json $OUT/wan21_720x1280x81_final_${card}.json 2>&1 | grep -v Warn | grep -v decodes | tail -12
else
  timeout 170 python3 -m rewrite.tools.sweep_winograd --shapes wan22 --groups large --max-tiles 2 --core \
    --json $OUT/winograd_large_tile_wan22_${card}_bf16.json 2>&1 | grep -v Warn | tail -30
fi
