#!/usr/bin/env bash
# Session 22, run 2: the three levels at 81 frames at HEAD: Wan 2.1 720p / 480p, Wan 2.2 720p.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 160 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_720.json 2>&1 | grep -v decodes | tee $OUT/bench21_720.log
timeout 160 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 1 --warmup 0 --json $OUT/wan22_720.json 2>&1 | grep -v decodes | tee $OUT/bench22_720.log
timeout 110 rewrite-bench --model wan2.1 --size 480x832 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_480.json 2>&1 | grep -v decodes | tee $OUT/bench21_480.log
timeout 150 python3 .gpu/conv96_mma_widths.py $OUT/mma_width.json 2>&1 | tail -12 | tee $OUT/mma_width.log
