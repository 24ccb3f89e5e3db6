#!/usr/bin/env bash
# Written in session 32, not run yet (issue 39): Wan 2.2's encode spends 17 ms of 184 in the exact two-pass norm
# kernel (docs/data/profiles/encode_wan22_704x1280x21_channels_last_h100.log); its widths 160 / 320 / 640 were never
# swept for the one-pass norm (`ops_fast._ONE_PASS_NORM_CHANNELS`). About 1 minute on an H100. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
for width in 160 320 640; do
  timeout 100 python3 -m rewrite.tools.sweep_norm --only "$width @" --json $OUT/norm_wan22_encoder_${width}_h100.json \
    2>&1 | tail -4
done
