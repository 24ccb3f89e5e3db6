#!/usr/bin/env bash
# Session 33's first GPU call, highest priority first (JSONs of finished steps come back if the call is cut off):
# whether the AvgDown3D kernel is ATen's shortcut bit for bit, issue 39's two open encode targets after the cache
# layout fix, the zero pads dropped and the AvgDown3D shortcut in one pass (Wan 2.2 704x1280x121, Wan 2.1
# 720x1280x81 at three levels), then the 704p encode with its norms one-pass at 160 / 320 / 640 channels (before
# cuDNN's convs too). Issue 40's Winograd decode A/B is gpu_winograd_decode_ab.sh. About 5 minutes on an H100.
# Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/downsample 2>&1 | tail -4
for case in "wan2.2 704x1280 121" "wan2.1 720x1280 81"; do
  set -- $case
  timeout 110 rewrite-bench --model $1 --encode --size $2 --frames $3 --levels off,lossless,channels_last \
    --json $OUT/encode_${1/./}_$2x$3.json 2>&1 | grep -v Warn | tail -4
done
timeout 100 python3 -c "
import sys
from rewrite.models.wan import ops_fast
ops_fast._ONE_PASS_NORM_CHANNELS |= {160, 320, 640}
ops_fast._ONE_PASS_BEFORE_CUDNN_CHANNELS |= {160, 320, 640}
from rewrite.tools.bench import main
sys.exit(main(sys.argv[1:]))" --model wan2.2 --encode --size 704x1280 --frames 121 --levels off,channels_last \
  --json $OUT/encode_wan22_704x1280x121_one_pass_norms.json 2>&1 | grep -v Warn | tail -3
