#!/usr/bin/env bash
# Session 24, run 2: the two failures of run 1's memory tests, with their messages.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 150 python3 -m pytest -q -p no:logging --tb=long tests/test_gpu_memory.py \
  -k "several_sizes or out_of_memory" 2>&1 | grep -v "^    \|^$" | tail -60 > $OUT/tests_memory.log
tail -40 $OUT/tests_memory.log
