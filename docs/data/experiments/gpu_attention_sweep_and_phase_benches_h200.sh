#!/usr/bin/env bash
# Session 19, run 2: GPU tests (attention, upsampler phases, chain/fast gpu); attention sweep; Wan 2.1 720p and
# Wan 2.2 720p 81-frame benches with the flash attention and the up-block-end phases (min-pixel routing).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 60 python3 -m rewrite.tools.sweep_attention --json $OUT/attention_sweep.json 2>&1 | tee $OUT/attention_sweep.log
timeout 150 python3 -m pytest -q tests/test_attention_fast.py tests/test_wan_upsample_fast.py 2>&1 | tail -3 | tee $OUT/tests.log
timeout 200 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 1 --warmup 0 --json $OUT/wan21_720.json 2>&1 | grep -v decodes | tee $OUT/bench720.log
timeout 150 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,channels_last --repeat 1 --warmup 0 --json $OUT/wan22_720.json 2>&1 | grep -v decodes | tee $OUT/bench22.log
timeout 100 python3 -m pytest -q -m gpu tests/test_wan_chain.py tests/test_wan_fast.py 2>&1 | tail -3 | tee -a $OUT/tests.log
