#!/usr/bin/env bash
# Session 20, run 4: flat programs in an epilogue of their own (the row programs' code as before): flat GPU tests,
# Wan 2.1 480p and 720p decodes (off, channels_last).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 90 python3 -m pytest -q -x tests/test_wan_fast.py -k "flat or pair_op_on_exact or epilogue_layouts" 2>&1 | tail -2 | tee $OUT/tests.log
timeout 110 rewrite-bench --model wan2.1 --size 480x832 --frames 81 --levels off,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_480.json 2>&1 | grep -v decodes | tail -4 | tee $OUT/bench21_480.log
timeout 150 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --levels off,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_720.json 2>&1 | grep -v decodes | tail -4 | tee $OUT/bench21_720.log
