#!/usr/bin/env bash
# Written in session 38 (issue 40), for the next call. On an H100: the per-layer GPU test of every F(4x4, 3x3) table
# shape (bf16, fp16; written in session 38, not yet run on a GPU), then Wan 2.1 1088x1920x81 and 720x1280x81 `off`
# against `channels_last` with the table as shipped (session 38 measured them with the same entries routed by
# bench_with_winograd_winners.py). On an H200: the per-layer test, then gpu_winograd_either_card.sh's H200 part (the
# Wan 2.2 F(4x4, 3x3) sweep and a 720p decode with its winners). About 8 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 120 python3 -m pytest -m gpu -q tests/kernels/winograd/test_large_tile.py -k every_routed 2>&1 | tail -4 \
  | tee $OUT/routed_shapes_test.log
if [ "$card" = h100 ]; then
  for size in 1088x1920 720x1280; do
    timeout 170 rewrite-bench --model wan2.1 --size $size --frames 81 --repeat 2 --levels off,channels_last \
      --json $OUT/wan21_${size}x81_shipped_${card}.json 2>&1 | grep -v Warn | grep -v decodes | tail -3
  done
else
  bash docs/data/experiments/gpu_winograd_either_card.sh
fi
