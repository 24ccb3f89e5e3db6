#!/usr/bin/env bash
# Session 34: the shipped code's Wan 2.2 numbers without run-time patches: the 81-frame channels_last decodes
# within the contract at 480p and 720p (the Winograd entry on the H100's 720p), then the 704x1280x121 encode at
# off and channels_last (one-pass norms at 160 / 320 / 640). About 4 minutes on an H100. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 150 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/models/wan/test_full_size_channels_last.py \
  -k "81_frames and wan2.2" 2>&1 | grep -E "dB|passed|failed|Error" | tail -6
timeout 100 rewrite-bench --model wan2.2 --encode --size 704x1280 --frames 121 --levels off,channels_last \
  --json $OUT/encode_wan22_704x1280x121.json 2>&1 | grep -v Warn | tail -3
