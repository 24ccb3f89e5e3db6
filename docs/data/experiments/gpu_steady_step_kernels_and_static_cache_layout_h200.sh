#!/usr/bin/env bash
# Session 21, run 2: the kernel sequence of one steady step (Wan 2.1 720p channels_last); the graph profile and the
# 81-frame bench with the static caches in the steady step's layout.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 120 python3 .gpu/eager_step_kernel_timeline.py wan2.1 720x1280 channels_last > $OUT/timeline21.log 2>&1; tail -3 $OUT/timeline21.log
timeout 90 rewrite-bench --model wan2.1 --size 720x1280 --frames 21 --levels channels_last --repeat 1 --warmup 0 --profile --profile-rows 30 2>&1 | grep -v decodes > $OUT/profile21.log; grep -E "elementwise|pad_rest|Memcpy|memcpy|best|channels_last " $OUT/profile21.log | cut -c1-60,150-260
timeout 130 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --levels off,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_720.json 2>&1 | grep -v decodes | tee $OUT/bench21_720.log
