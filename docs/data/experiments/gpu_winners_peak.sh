#!/usr/bin/env bash
# Superseded in session 37 before it ran: the transforms are no longer kept (gpu_weight_transform_per_call.sh).
# Session 36 (issue 40), not run yet (the device time ran out): where Wan 2.2 720x1280x81's `channels_last` peak is
# reached, as shipped and with the H100 sweep's Winograd winners routed (peak_by_stage.py: each stage's allocated
# and peak memory, the kept weight transforms' bytes), after the weight transform went by blocks (the winners' peak
# was 17.90 GiB before, the shipped route's 13.42, `off`'s 12.30); then the winners' decode against `off` (time and
# contract). About 6 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
sweep=docs/data/sweeps/winograd_large_tile_widths_h100_bf16.json
timeout 100 python3 docs/data/experiments/peak_by_stage.py 2>&1 | grep -v Warn | tee $OUT/peak_by_stage_shipped.log
timeout 100 python3 docs/data/experiments/peak_by_stage.py --winners $sweep 2>&1 | grep -v Warn \
  | tee $OUT/peak_by_stage_winners.log
timeout 150 python3 docs/data/experiments/bench_with_winograd_winners.py $sweep 1.05 -- --model wan2.2 \
  --size 720x1280 --frames 81 --levels off,channels_last --repeat 2 \
  --json $OUT/wan22_720x1280x81_winners_blocked_transform_h100.json 2>&1 | grep -v Warn | grep -v decodes | tail -14
