#!/usr/bin/env bash
# Session 35 (issue 40): Wan 2.2 720x1280x81, `off` and `channels_last` as shipped with the H100's F(4x4, 3x3) entries
# and the transforms' temporaries banded to 512 MiB (peak against `off`'s). About 2 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 170 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,channels_last --repeat 2 \
  --json $OUT/wan22_720x1280x81_large_tile_banded_${card}.json 2>&1 | grep -v Warn | tail -4
