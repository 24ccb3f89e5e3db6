#!/usr/bin/env bash
# Session 33, at the end of its device time: the AvgDown3D kernel against ATen on the GPU (if torch.equal, the
# pattern can move to lossless), then Wan 2.2's 704x1280x121 encode at off and channels_last (issue 39's 2.0x).
# About 2.5 minutes on an H100. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 50 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/downsample 2>&1 | tail -4
timeout 90 rewrite-bench --model wan2.2 --encode --size 704x1280 --frames 121 --levels off,channels_last \
  --json $OUT/encode_wan22_704x1280x121.json 2>&1 | grep -v Warn | tail -3
