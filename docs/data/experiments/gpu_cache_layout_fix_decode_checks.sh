#!/usr/bin/env bash
# Written in session 31, not run yet: the static caches' layout fix also gives two of the decoder's caches (read for
# their sizes) channels-last buffers on the tiny CPU capture. The full-size decode tests and Wan 2.1 / 2.2 720p
# decodes at three levels, to see whether the decode changed. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/models/wan/test_full_size_decodes.py 2>&1 | tail -3
for model in wan2.1 wan2.2; do
  timeout 120 rewrite-bench --model $model --size 720x1280 --frames 81 --levels off,lossless,channels_last \
    --json $OUT/decode_${model/./}_720x1280x81.json 2>&1 | grep -v Warn | tail -4
done
