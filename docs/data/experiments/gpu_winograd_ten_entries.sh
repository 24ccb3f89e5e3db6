#!/usr/bin/env bash
# Written in session 37 (issue 40), for the H100 (its ten F(4x4, 3x3) entries; another card has none): Wan 2.2 as
# shipped at 6489ddb and after (point scales kept, the points per call), 720x1280x81 and 480x832x81 `off` against
# `channels_last` (time, peak, contract), then the full-size contract tests of Wan 2.2 with the ten entries routed.
# About 7 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
for size in 720x1280 480x832; do
  timeout 150 rewrite-bench --model wan2.2 --size $size --frames 81 --repeat 2 --levels off,channels_last \
    --json $OUT/wan22_${size}x81_scales_kept_${card}.json 2>&1 | grep -v Warn | grep -v decodes | tail -3
done
timeout 200 python3 -m pytest -m gpu -q tests/models/wan/test_full_size_channels_last.py -k wan2.2 2>&1 | tail -3 \
  | tee $OUT/full_size_wan22.log
