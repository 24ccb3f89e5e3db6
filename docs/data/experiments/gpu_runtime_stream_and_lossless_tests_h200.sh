#!/usr/bin/env bash
# Session 22, run 3: the rest of `pytest -m gpu` at HEAD, part 1: the runtime contract (threads, streams, train
# mode, edits, pickling), streaming decode, the lossless full-size decodes.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 200 python3 -m pytest -q -p no:logging --tb=short --durations=5 tests/test_gpu_contract.py tests/test_stream.py -m gpu 2>&1 | tail -12 | tee $OUT/tests_contract.log
timeout 330 python3 -m pytest -q -p no:logging --tb=short --durations=10 tests/test_gpu_wan.py -k "not two_resolutions" 2>&1 | tail -16 | tee $OUT/tests_gpu_wan.log
