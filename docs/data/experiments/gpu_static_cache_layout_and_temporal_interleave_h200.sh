#!/usr/bin/env bash
# Session 21, run 3: static caches in the steady layout + the Triton temporal interleave: GPU tests of the touched
# ops, lossless exactness (the bench's `equal`) and the three levels at 81 frames, Wan 2.1 720p / 480p, Wan 2.2 720p.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 40 python3 -m pytest -q tests/test_wan_kernels.py -k "interleave or dup_up or upsample" 2>&1 | tail -1 | tee $OUT/tests.log
timeout 70 python3 -m pytest -q tests/test_gpu_wan.py tests/test_gpu_wan_fast.py -k "two_resolutions" 2>&1 | tail -1 | tee -a $OUT/tests.log
timeout 150 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_720.json 2>&1 | grep -v decodes | tee $OUT/bench21_720.log
timeout 150 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 1 --warmup 0 --json $OUT/wan22_720.json 2>&1 | grep -v decodes | tee $OUT/bench22_720.log
timeout 100 rewrite-bench --model wan2.1 --size 480x832 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_480.json 2>&1 | grep -v decodes | tee $OUT/bench21_480.log
