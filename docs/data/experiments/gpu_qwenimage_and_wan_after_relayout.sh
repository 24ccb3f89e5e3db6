#!/usr/bin/env bash
# Session 25, run 6 (issues 37, 38): Qwen-Image's VAE at 1328x1328 and 1664x928 (bf16, one image) at three levels
# after the re-layout, Wan 2.1 1088x1920x81 `off`/`lossless` with the norm store fix, and Wan 2.1 720x1280x21 at
# three levels against the same size before the re-layout (runs 2-4). About 5 minutes of device time were left.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for size in 1328x1328 1664x928; do
  timeout 60 rewrite-bench --model qwenimage --size $size --frames 1 --levels off,lossless,channels_last --repeat 3 \
    --json $OUT/qwenimage_$size.json 2>&1 | grep -v "decodes:" | tail -5 | tee -a $OUT/bench.log
done
timeout 110 rewrite-bench --size 1088x1920 --frames 81 --levels off,lossless --repeat 2 --warmup 0 \
  --json $OUT/wan21_1088x1920x81.json 2>&1 | grep -v "decodes:" | tail -4 | tee -a $OUT/bench.log
timeout 60 rewrite-bench --size 720x1280 --frames 21 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/wan21_720x1280x21.json 2>&1 | grep -v "decodes:" | tail -5 | tee -a $OUT/bench.log
