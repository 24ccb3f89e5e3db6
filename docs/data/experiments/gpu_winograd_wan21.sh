#!/usr/bin/env bash
# Written in session 36 (issues 40 and 37), for either card: the F(4x4, 3x3) sweep, core timings only, of Wan 2.1's
# 192- and 384-channel convs at 480p, 720p and 1080p (its 96-channel ones have too little work per point to
# pay), then Wan 2.1 720p and 1088x1920 decodes with the sweep's winners routed (margin 1.05), then Wan 2.2
# 704x1280x121 as shipped. About 9.5 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 150 python3 -m rewrite.tools.sweep_winograd --shapes wan21,wan21_480,wan21_1080 --only 192,384 \
  --groups large --max-tiles 2 --core --json $OUT/winograd_large_tile_wan21_${card}_bf16.json 2>&1 | grep -v Warn \
  | tee $OUT/sweep_wan21.log | tail -30
for size in 720x1280 1088x1920; do
  timeout 150 python3 docs/data/experiments/bench_with_winograd_winners.py \
    $OUT/winograd_large_tile_wan21_${card}_bf16.json 1.05 -- --model wan2.1 --size $size --frames 81 \
    --levels off,channels_last --json $OUT/wan21_${size}x81_winograd_winners_${card}.json 2>&1 | grep -v Warn | tail -12
done
timeout 130 rewrite-bench --model wan2.2 --size 704x1280 --frames 121 --levels off,channels_last \
  --json $OUT/wan22_704x1280x121_large_tile_${card}.json 2>&1 | grep -v Warn | tail -3
