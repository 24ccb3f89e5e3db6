#!/usr/bin/env bash
# Session 36 (issue 40): Wan 2.2 720x1280x81 off / channels_last with the H100 sweep's Winograd winners routed,
# after the weight transform went by blocks (its peak was 17.90 GiB before, off 12.30). About 2 minutes.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 200 python3 docs/data/experiments/bench_with_winograd_winners.py docs/data/sweeps/winograd_large_tile_widths_h100_bf16.json 1.05 -- --model wan2.2 --size 720x1280 --frames 81 --levels off,channels_last --repeat 1 --json $OUT/wan22_720x1280x81_winners_blocked_transform_h100.json 2>&1 | grep -v Warn | grep -v decodes | tail -14
