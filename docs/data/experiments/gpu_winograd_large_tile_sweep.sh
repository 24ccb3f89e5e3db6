#!/usr/bin/env bash
# Session 35 (issue 40): Winograd F(4x4, 3x3) (`rewrite.kernels.winograd.large_tile`, the split form with fp16
# operands) against F(2x2, 3x3)'s split form, cuDNN and the Triton direct conv, per Wan 2.2 layer, bf16; then Wan 2.2
# 720x1280x81 `off` and `channels_last` with the sweep's winners routed (`winograd_entries_from_sweep.py`), in the same
# process order on the same card. About 8 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 240 python3 -m rewrite.tools.sweep_winograd --shapes wan22 --groups split_best,large \
  --json $OUT/winograd_large_tile_wan22_${card}_bf16.json 2>&1 | grep -v Warn | tee $OUT/sweep.log | tail -60
timeout 220 python3 docs/data/experiments/winograd_entries_from_sweep.py $OUT/winograd_large_tile_wan22_${card}_bf16.json \
  --model wan2.2 --size 720x1280 --frames 81 --levels off,channels_last \
  --json $OUT/wan22_720x1280x81_large_tile_${card}.json 2>&1 | grep -v Warn | grep -v "decodes:" | tail -12
