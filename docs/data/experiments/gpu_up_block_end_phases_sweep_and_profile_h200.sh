#!/usr/bin/env bash
# Session 19, run 1: GPU tests (25b9d50's refactor + the up-block-end phases); the up-block-end sweep; a Wan 2.2
# 720p decode with the cuDNN phases; a 21-frame Wan 2.1 720p channels_last profile.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: 25b9d50 + working tree (wan_upsample_fast)"
timeout 100 python3 -m rewrite.tools.sweep_conv3d --shapes wan22up,wan21up --max-tiles 0 --json $OUT/up_sweep.json 2>&1 | grep -v "phases (" | tee $OUT/up_sweep.log
timeout 200 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,channels_last --repeat 1 --warmup 0 --json $OUT/wan22_720.json 2>&1 | grep -v decodes | tee $OUT/bench22.log
timeout 150 python3 -m pytest -q -m gpu tests/test_wan_chain.py tests/test_wan_fast.py 2>&1 | tail -3 | tee $OUT/tests.log
timeout 60 python3 -m pytest -q tests/test_wan_upsample_fast.py 2>&1 | tail -3 | tee -a $OUT/tests.log
timeout 100 rewrite-bench --model wan2.1 --size 720x1280 --frames 21 --levels channels_last --profile --profile-rows 30 2>&1 | grep -v decodes | tee $OUT/prof21_720.txt
