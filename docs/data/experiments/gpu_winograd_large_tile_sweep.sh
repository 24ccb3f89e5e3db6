#!/usr/bin/env bash
# Session 35 (issue 40): Winograd F(4x4, 3x3) (`rewrite.kernels.winograd.large_tile`, the split form with fp16
# operands) against F(2x2, 3x3)'s split form, cuDNN and the Triton direct conv, per Wan layer, bf16, one process.
# About 5 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 500 python3 -m rewrite.tools.sweep_winograd --shapes wan22,wan21 --groups split,large \
  --json $OUT/winograd_large_tile_wan_$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)_bf16.json 2>&1 | grep -v Warn | tee $OUT/sweep.log | tail -90
