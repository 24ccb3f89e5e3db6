#!/usr/bin/env bash
# Session 33, with little device time left: whether the AvgDown3D kernel is ATen's shortcut and add bit for bit, and
# Wan 2.2's 704x1280x121 encode at three levels after the cache layout fix, the zero pads dropped and the AvgDown3D
# shortcut in one pass (issue 39's 2.0x), then Wan 2.1's 720x1280x81 at off and channels_last (2.8x). About
# 4 minutes on an H100. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/downsample 2>&1 | tail -4
timeout 110 rewrite-bench --model wan2.2 --encode --size 704x1280 --frames 121 --levels off,lossless,channels_last \
  --json $OUT/encode_wan22_704x1280x121.json 2>&1 | grep -v Warn | tail -4
timeout 80 rewrite-bench --model wan2.1 --encode --size 720x1280 --frames 81 --levels off,channels_last \
  --json $OUT/encode_wan21_720x1280x81.json 2>&1 | grep -v Warn | tail -3
