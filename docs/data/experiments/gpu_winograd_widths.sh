#!/usr/bin/env bash
# Written in session 36 (issues 40 and 37), for either card: (1) on an H100, Wan 2.2 720x1280x81 `off` /
# `channels_last` as shipped (the banded F(4x4, 3x3) temporaries: time and peak against `off`'s); (2) the F(4x4, 3x3)
# sweep, core timings only, of the Wan 2.2 convs the table lacks (the 45x80 mid block, the channel-halving resnets,
# the 480p planes) and, on an H200, those it has, then the 256-channel conv at further GEMM blocks; (3) a Wan 2.2 720p
# decode with the sweep's winners routed (bench_with_winograd_winners.py, margin 1.05); (4) on an H100 the full-size
# Wan 2.2 contract tests; (5) the 480p decode with the winners. Most needed first: a short lease still brings (1)-(3).
# About 9.5 minutes.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
shapes=wan22,wan22_more,wan22_480
if [ "$card" = h100 ]; then
  shapes=wan22_more,wan22_480
  timeout 150 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,channels_last --repeat 2 \
    --json $OUT/wan22_720x1280x81_large_tile_banded_${card}.json 2>&1 | grep -v Warn | tail -3
fi
timeout 150 python3 -m rewrite.tools.sweep_winograd --shapes $shapes --groups large --max-tiles 2 --core \
  --json $OUT/winograd_large_tile_widths_${card}_bf16.json 2>&1 | grep -v Warn | tee $OUT/sweep_widths.log | tail -30
timeout 60 python3 -m rewrite.tools.sweep_winograd --shapes wan22 --only 256 --groups large,large_more --core \
  --json $OUT/winograd_large_more_256_${card}_bf16.json 2>&1 | grep -v Warn | tee $OUT/sweep_256.log | tail -13
for size in 720x1280; do
  timeout 120 python3 docs/data/experiments/bench_with_winograd_winners.py \
    $OUT/winograd_large_tile_widths_${card}_bf16.json 1.05 -- --model wan2.2 --size $size --frames 81 \
    --levels off,channels_last --json $OUT/wan22_${size}x81_winograd_winners_${card}.json 2>&1 | grep -v Warn | tail -12
done
[ "$card" = h100 ] && timeout 150 python3 -m pytest -q -m gpu tests/models/wan/test_full_size_channels_last.py \
  -k "wan2.2" 2>&1 | tail -3
timeout 120 python3 docs/data/experiments/bench_with_winograd_winners.py \
  $OUT/winograd_large_tile_widths_${card}_bf16.json 1.05 -- --model wan2.2 --size 480x832 --frames 81 \
  --levels off,channels_last --json $OUT/wan22_480x832x81_winograd_winners_${card}.json 2>&1 | grep -v Warn | tail -12
