#!/usr/bin/env bash
# Session 21, run 5: GPU tests not run recently: Wan 2.2 480p 81 frames (lossless torch.equal; channels_last contract),
# the fp32 / fp16 lossless decodes of both models.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 200 python3 -m pytest -q -p no:logging --tb=line tests/test_gpu_wan.py -k "other_dtypes or (wan2.2 and 480p)" 2>&1 | tail -4 | tee $OUT/tests.log
timeout 150 python3 -m pytest -q -p no:logging --tb=line tests/test_gpu_wan_fast.py -k "wan2.2 and 480p" 2>&1 | tail -4 | tee -a $OUT/tests.log
