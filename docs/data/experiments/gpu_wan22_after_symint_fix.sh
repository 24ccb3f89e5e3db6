#!/usr/bin/env bash
# Session 34, after the SymInt fix (a42b3aa) and avg_down_add moved to lossless: the AvgDown3D kernel's GPU test
# (now with small planes), Wan 2.2's 704x1280x121 encode at three levels, the same encode with one-pass norms at
# 160 / 320 / 640 channels, then issue 40's Winograd decode A/B (gpu_winograd_decode_ab.sh). About 8 minutes on an
# H100. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/downsample 2>&1 | tail -3
timeout 130 rewrite-bench --model wan2.2 --encode --size 704x1280 --frames 121 --levels off,lossless,channels_last \
  --json $OUT/encode_wan22_704x1280x121.json 2>&1 | grep -v Warn | tail -4
timeout 100 python3 -c "
import sys
from rewrite.models.wan import ops_fast
ops_fast._ONE_PASS_NORM_CHANNELS |= {160, 320, 640}
ops_fast._ONE_PASS_BEFORE_CUDNN_CHANNELS |= {160, 320, 640}
from rewrite.tools.bench import main
sys.exit(main(sys.argv[1:]))" --model wan2.2 --encode --size 704x1280 --frames 121 --levels off,channels_last \
  --json $OUT/encode_wan22_704x1280x121_one_pass_norms.json 2>&1 | grep -v Warn | tail -3
bash docs/data/experiments/gpu_winograd_decode_ab.sh 2>&1 | grep -v "Target directory" | tail -8
