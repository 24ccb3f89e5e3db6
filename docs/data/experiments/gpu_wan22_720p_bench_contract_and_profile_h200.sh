#!/usr/bin/env bash
# Session 19, run 5 (two calls on the warm machine of run 4): Wan 2.2 720p three-level bench and its 81-frame
# contract test; then the 21-frame Wan 2.2 720p channels_last profile.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
timeout 200 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 1 --warmup 0 --json $OUT/wan22_720.json 2>&1 | grep -v decodes | tee $OUT/bench22.log
timeout 150 python3 -m pytest -q tests/test_gpu_wan_fast.py -k "wan2.2 and 720p" 2>&1 | tail -2 | tee $OUT/tests.log
timeout 120 rewrite-bench --model wan2.2 --size 720x1280 --frames 21 --levels channels_last --profile --profile-rows 30 2>&1 | grep -v decodes | tee $OUT/prof22_720.txt
