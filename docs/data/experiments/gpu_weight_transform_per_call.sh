#!/usr/bin/env bash
# Session 37 (issue 40): F(4x4, 3x3)'s weight transform on every call instead of kept per weight. In one run: the
# transform alone per Wan weight shape, then Wan 2.2 720x1280x81 decodes (`rewrite-bench`, `off` first).
# H100: as shipped (time, peak, contract); with the H100 sweep's winners (their tiles' times plus the transform,
# chosen at a 1.05 margin); the shipped route with the transforms kept (`channels_last` only: what the per-call
# transform costs). H200 (no F(4x4) table yet): the sweep of Wan 2.2's 720p convs, then the decode with its
# winners. About 9 minutes.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
bench="--model wan2.2 --size 720x1280 --frames 81 --repeat 2"
quiet() { grep -v Warn | grep -v decodes; }
timeout 60 python3 docs/data/experiments/time_weight_transform.py 2>&1 | quiet | tee $OUT/weight_transform.log
if [ "$card" = h100 ]; then
  sweep=docs/data/sweeps/winograd_large_tile_widths_h100_bf16.json
  timeout 170 rewrite-bench $bench --levels off,channels_last --json $OUT/wan22_720x1280x81_per_call_h100.json 2>&1 \
    | quiet | tail -14 | tee $OUT/per_call.log
else
  sweep=$OUT/winograd_large_tile_wan22_${card}_bf16.json
  timeout 200 python3 -m rewrite.tools.sweep_winograd --shapes wan22,wan22_more --groups large --max-tiles 2 --core \
    --json $sweep 2>&1 | quiet | tee $OUT/sweep_wan22.log
fi
timeout 170 python3 docs/data/experiments/bench_with_winograd_winners.py $sweep 1.05 -- $bench \
  --levels off,channels_last --json $OUT/wan22_720x1280x81_per_call_winners_${card}.json 2>&1 | quiet | tail -30 \
  | tee $OUT/per_call_winners.log
[ "$card" = h100 ] && timeout 120 python3 docs/data/experiments/bench_kept_weight_transforms.py -- $bench \
  --levels channels_last --json $OUT/wan22_720x1280x81_kept_h100.json 2>&1 | quiet | tail -10 | tee $OUT/kept.log
