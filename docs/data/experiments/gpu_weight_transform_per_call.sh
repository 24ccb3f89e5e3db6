#!/usr/bin/env bash
# Session 37 (issue 40): F(4x4, 3x3)'s weight transform on every call instead of kept per weight. In one run: the
# transform alone per Wan weight shape; Wan 2.2 720x1280x81 `off` and `channels_last` as shipped (time, peak,
# contract); with the H100 sweep's winners (their tiles' times plus the transform, chosen at a 1.05 margin); the
# shipped route with the transforms kept (`channels_last` only: what the per-call transform costs). About 9 minutes.
. docs/data/experiments/gpu_setup.sh || exit 1
sweep=docs/data/sweeps/winograd_large_tile_widths_h100_bf16.json
bench="--model wan2.2 --size 720x1280 --frames 81 --repeat 2"
timeout 60 python3 docs/data/experiments/time_weight_transform.py 2>&1 | grep -v Warn | tee $OUT/weight_transform.log
timeout 170 rewrite-bench $bench --levels off,channels_last --json $OUT/wan22_720x1280x81_per_call.json 2>&1 \
  | grep -v Warn | grep -v decodes | tail -14 | tee $OUT/per_call.log
timeout 170 python3 docs/data/experiments/bench_with_winograd_winners.py $sweep 1.05 -- $bench \
  --levels off,channels_last --json $OUT/wan22_720x1280x81_per_call_winners.json 2>&1 | grep -v Warn \
  | grep -v decodes | tail -30 | tee $OUT/per_call_winners.log
timeout 120 python3 docs/data/experiments/bench_kept_weight_transforms.py -- $bench --levels channels_last \
  --json $OUT/wan22_720x1280x81_kept.json 2>&1 | grep -v Warn | grep -v decodes | tail -10 | tee $OUT/kept.log
