#!/usr/bin/env bash
# Written in session 38 (issue 40), for whichever card comes: on an H100, gpu_winograd_wan21_shipped.sh without its
# 720p bench; on an H200 (no F(4x4, 3x3) entries yet), the F(4x4, 3x3) sweep of Wan 2.2's 720p convs (core timings,
# the weight points per call) and a Wan 2.2 720x1280x81 decode with its winners routed (margin 1.05). About 7
# minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
if [ "$card" = h100 ]; then
  sed '/--size 720x1280/,$d' docs/data/experiments/gpu_winograd_wan21_shipped.sh | sed '/^timeout 120 rewrite-bench/d' \
    > /tmp/shipped.sh
  exec bash /tmp/shipped.sh
fi
timeout 200 python3 -m rewrite.tools.sweep_winograd --shapes wan22,wan22_more --groups large --max-tiles 2 --core \
  --json $OUT/winograd_large_tile_wan22_${card}_bf16.json 2>&1 | grep -v Warn | tee $OUT/sweep_wan22.log | tail -40
timeout 200 python3 docs/data/experiments/bench_with_winograd_winners.py \
  $OUT/winograd_large_tile_wan22_${card}_bf16.json 1.05 -- --model wan2.2 --size 720x1280 --frames 81 \
  --levels off,channels_last --json $OUT/wan22_720x1280x81_winograd_winners_${card}.json 2>&1 | grep -v Warn \
  | grep -v decodes | tail -14
