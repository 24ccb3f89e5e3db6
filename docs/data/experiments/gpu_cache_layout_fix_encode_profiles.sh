#!/usr/bin/env bash
# Written in session 32 (issue 39): device-time profiles of the channels_last encodes at 21 frames after the static
# caches' layout fix, to compare with session 31's (docs/data/profiles/encode_wan2*_channels_last_h100.log): were the
# ATen elementwise copies of the caches the 16 ms (Wan 2.2) / 42 ms (Wan 2.1) they looked like? Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
for case in "wan2.1 720x1280" "wan2.2 704x1280"; do
  set -- $case
  timeout 200 rewrite-bench --model $1 --encode --size $2 --frames 21 --levels channels_last --profile \
    --profile-rows 25 2>&1 | grep -v Warn > $OUT/encode_${1/./}_$2x21_channels_last_after_cache_fix.log
  tail -40 $OUT/encode_${1/./}_$2x21_channels_last_after_cache_fix.log | cut -c1-60,150-230
done
