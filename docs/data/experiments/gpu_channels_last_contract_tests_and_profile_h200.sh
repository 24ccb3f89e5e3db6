#!/usr/bin/env bash
# Session 19, run 4: channels_last GPU contract tests (fp16, two resolutions and a weight reload); the 21-frame
# Wan 2.1 720p channels_last profile of the final code.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 170 python3 -m pytest -q tests/test_gpu_wan_fast.py -k "fp16 or two_resolutions" 2>&1 | tail -3 | tee $OUT/tests.log
timeout 90 rewrite-bench --model wan2.1 --size 720x1280 --frames 21 --levels channels_last --profile --profile-rows 25 2>&1 | grep -v decodes | tee $OUT/prof21_720.txt
