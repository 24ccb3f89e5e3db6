#!/usr/bin/env bash
# Session 24, run 2: one graph pool and cache block per module (issue 37 items 1-3 on the GPU: memory back on
# delete, a real out-of-memory fallback, several sizes within 1.3x of the largest), what each size holds, and
# AuK channels_last in half precision against its contract.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 300 python3 -m pytest -q -p no:logging --tb=short --durations=8 tests/test_gpu_memory.py 2>&1 | tail -20 \
  | tee $OUT/tests_memory.log
timeout 90 python3 -m pytest -q -s -p no:logging --tb=short tests/test_gpu_auk_runtime.py -k half_precision 2>&1 \
  | grep -E "clip|passed|failed|Error" | tee $OUT/tests_auk_half.log
timeout 90 python3 docs/data/experiments/s23_graph_memory_by_size.py lossless 2>&1 | tail -6 | tee $OUT/sizes.log
