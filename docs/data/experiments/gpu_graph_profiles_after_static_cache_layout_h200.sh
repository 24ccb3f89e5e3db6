#!/usr/bin/env bash
# Session 21, run 4: the mended lossless two-resolution test; 21-frame graph profiles of Wan 2.1 and 2.2 720p
# channels_last after the static-cache layout and the Triton temporal interleave.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 80 python3 -m pytest -q -p no:logging tests/test_gpu_wan.py -k "two_resolutions" 2>&1 | tail -1 | tee $OUT/tests.log
timeout 90 rewrite-bench --model wan2.1 --size 720x1280 --frames 21 --levels channels_last --repeat 1 --warmup 0 --profile --profile-rows 30 2>&1 | grep -v decodes > $OUT/profile21.log; grep -E "elementwise|pad_rest|memcpy|CatArray|best|channels_last |Self CUDA" $OUT/profile21.log | cut -c1-60,150-260
timeout 120 rewrite-bench --model wan2.2 --size 720x1280 --frames 21 --levels channels_last --repeat 1 --warmup 0 --profile --profile-rows 30 2>&1 | grep -v decodes > $OUT/profile22.log; grep -E "elementwise|pad_rest|memcpy|CatArray|best|channels_last |Self CUDA" $OUT/profile22.log | cut -c1-60,150-260
