#!/usr/bin/env bash
# Written in session 38 (issue 40), for the next call. Both cards: the per-layer GPU test of every F(4x4, 3x3) table
# shape (bf16, fp16; not yet run on a GPU). On an H100: Wan 2.1 720x1280x81 `off` / `channels_last` as shipped, then
# with the sweep's eight Wan 2.1 winners routed (`bench_with_winograd_winners.py`; the op now asks the Winograd table
# ahead of the direct conv, so they run: the A/B session 38 could not make), then 1088x1920x81 with them. On an H200:
# gpu_winograd_either_card.sh's H200 part (the Wan 2.2 F(4x4, 3x3) sweep and a 720p decode with its winners).
# About 9 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 120 python3 -m pytest -m gpu -q tests/kernels/winograd/test_large_tile.py -k every_routed 2>&1 | tail -4 \
  | tee $OUT/routed_shapes_test.log
if [ "$card" != h100 ]; then
  exec bash docs/data/experiments/gpu_winograd_either_card.sh
fi
sweep=docs/data/sweeps/winograd_large_tile_wan21_h100_bf16.json
timeout 120 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --repeat 2 --levels off,channels_last \
  --json $OUT/wan21_720x1280x81_shipped_${card}.json 2>&1 | grep -v Warn | grep -v decodes | tail -3
for size in 720x1280 1088x1920; do
  timeout 170 python3 docs/data/experiments/bench_with_winograd_winners.py $sweep 1.05 -- --model wan2.1 \
    --size $size --frames 81 --repeat 2 --levels off,channels_last \
    --json $OUT/wan21_${size}x81_winograd_first_${card}.json 2>&1 | grep -v Warn | grep -v decodes | tail -12
done
