#!/usr/bin/env bash
# Session 27, run 3 (same machine, warm): where the encode's time goes at 720x1280x21 (`off` and `lossless`), and
# Qwen-Image 1664x928 at three levels with single-frame decodes on chunk 0's CUDA graph alone.
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 70 rewrite-bench --encode --size 720x1280 --frames 21 --levels off,lossless --repeat 1 --warmup 0 --profile \
  --profile-rows 22 > $OUT/encode_profile_720x1280x21.log 2>&1
grep -v "decodes:" $OUT/encode_profile_720x1280x21.log | cut -c1-200 | head -60
timeout 45 rewrite-bench --model qwenimage --size 1664x928 --frames 1 --levels off,lossless,channels_last --repeat 3 \
  --json $OUT/qwenimage_1664x928.json 2>&1 | grep -v "decodes:" | tail -5
