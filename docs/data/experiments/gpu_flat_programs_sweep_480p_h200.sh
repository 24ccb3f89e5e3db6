#!/usr/bin/env bash
# Session 20, run 2: flat programs (the Triton conv over rows the row tiles do not divide): their GPU tests, the
# 480p sweep with flat candidates and the fused norm epilogue, the 480p decode, a 720p channels_last check.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 120 python3 -m pytest -q tests/test_wan_fast.py -k "flat or matches_the_conv or epilogue_layouts or two_row or pair_op_on_exact" 2>&1 | tail -4 | tee $OUT/tests.log
timeout 200 python3 -m rewrite.tools.sweep_conv3d --shapes wan21_480 --only "192 @,384 @ 2x,192->384" --decode-epilogues --json $OUT/sweep480.json 2>&1 | tee $OUT/sweep480.log
timeout 100 rewrite-bench --model wan2.1 --size 480x832 --frames 81 --levels off,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_480.json 2>&1 | grep -v decodes | tee $OUT/bench21_480.log
timeout 90 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --levels channels_last --repeat 2 --warmup 0 --json $OUT/wan21_720.json 2>&1 | grep -v decodes | tee $OUT/bench21_720.log
