#!/usr/bin/env bash
# Session 20, run 5: the channels_last contract in fp16 at 480p (flat programs) and fp32 exact; the gpu-marked
# tests of test_wan_fast.py.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 100 python3 -m pytest -q tests/test_gpu_wan_fast.py -k fp16 2>&1 | tail -2 | tee $OUT/tests.log
timeout 50 python3 -m pytest -q -m gpu tests/test_wan_fast.py 2>&1 | tail -2 | tee -a $OUT/tests.log
