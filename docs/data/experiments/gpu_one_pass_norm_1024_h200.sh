#!/usr/bin/env bash
# Session 19, run 6: the one-pass norm at 1024 channels (sweep, kernel tests on CUDA) and Wan 2.2 720p with it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 40 python3 -m rewrite.tools.sweep_norm --only 1024 --json $OUT/norm1024.json 2>&1 | tee $OUT/norm1024.log
timeout 120 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 1 --warmup 0 --json $OUT/wan22_720.json 2>&1 | grep -v decodes | tee $OUT/bench22.log
timeout 40 python3 -m pytest -q tests/test_norm_fast.py 2>&1 | tail -2 | tee $OUT/tests.log
