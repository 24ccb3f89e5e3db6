#!/usr/bin/env bash
# Written in session 31, not run yet (issue 39): after the static caches' layout fix (`cache_writes._reads_no_strides`),
# the full-size encode tests (bit-identical at lossless, the channels_last contract incl. the H100's new entries at
# 720p / 704p), then the three encodes at three levels. About 8 minutes on an H100. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 240 python3 -m pytest -q -p no:cacheprovider -rA tests/models/wan/test_full_size_encodes.py 2>&1 \
  | grep -E "latents:|passed|failed|Error" | cut -c1-300
for case in "wan2.1 720x1280 81" "wan2.2 704x1280 121" "wan2.1 480x832 81"; do
  set -- $case
  timeout 110 rewrite-bench --model $1 --encode --size $2 --frames $3 --levels off,lossless,channels_last \
    --json $OUT/encode_${1/./}_$2x$3.json 2>&1 | grep -v Warn | tail -4
done
