#!/usr/bin/env bash
# Session 20, run 1: GPU tests of the phase-weight kernel (45cd2bd) and the review refactors; Wan 2.1 720p/480p and
# Wan 2.2 720p 81-frame benches at all three levels.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 60 python3 -m pytest -q tests/test_wan_upsample_fast.py tests/test_attention_fast.py 2>&1 | tail -3 | tee $OUT/tests.log
timeout 150 python3 -m pytest -q -m gpu tests/test_wan_chain.py tests/test_wan_fast.py 2>&1 | tail -3 | tee -a $OUT/tests.log
timeout 130 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_720.json 2>&1 | grep -v decodes | tee $OUT/bench21_720.log
timeout 80 rewrite-bench --model wan2.1 --size 480x832 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_480.json 2>&1 | grep -v decodes | tee $OUT/bench21_480.log
timeout 140 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 1 --warmup 0 --json $OUT/wan22_720.json 2>&1 | grep -v decodes | tee $OUT/bench22.log
