#!/usr/bin/env bash
# Session 23, run 2: GPU memory given back on delete and a real out-of-memory fallback (tests/test_gpu_memory.py),
# and what each decoded size holds (issue 37's baseline).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 240 python3 -m pytest -q -p no:logging --tb=short --durations=8 tests/test_gpu_memory.py 2>&1 | tail -30 \
  | tee $OUT/tests_gpu.log
timeout 150 python3 docs/data/experiments/graph_memory_by_size.py lossless 2>&1 | tail -6 | tee $OUT/sizes.log
