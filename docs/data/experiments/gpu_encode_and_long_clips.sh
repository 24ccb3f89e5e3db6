#!/usr/bin/env bash
# Session 27, run 2 (the machine of run 1, still warm; issue 39 targets, issue 37 item 5): the encode benches at
# issue 39's sizes, then the long clips at three levels (Wan 2.1 480x832 at 81/161/241 frames, 720x1280x161).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 85 rewrite-bench --encode --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/encode_wan21_720x1280x81.json 2>&1 | grep -v "decodes:" | tail -5
timeout 110 rewrite-bench --encode --model wan2.2 --size 704x1280 --frames 121 --levels off,lossless,channels_last \
  --repeat 1 --warmup 0 --json $OUT/encode_wan22_704x1280x121.json 2>&1 | grep -v "decodes:" | tail -5
timeout 170 python3 -m rewrite.tools.sweep_sizes --models wan2.1 --sizes 480x832 --frames 81,161,241 --repeat 1 \
  --json $OUT/long_clips_480x832.json > $OUT/long_480.log 2>&1
grep -E "^(wan|off|lossless|channels_last)|BELOW|meets|peak|Error" $OUT/long_480.log | tail -16
timeout 120 python3 -m rewrite.tools.sweep_sizes --models wan2.1 --sizes 720x1280 --frames 161 --repeat 1 \
  --json $OUT/long_clips_720x1280.json > $OUT/long_720.log 2>&1
grep -E "^(wan|off|lossless|channels_last)|BELOW|meets|peak|Error" $OUT/long_720.log | tail -8
