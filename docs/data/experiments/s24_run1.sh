#!/usr/bin/env bash
# Session 24, run 1: the 1080p cliff (norms past 32-bit indexing: tests, a 1088x1920 bench), one graph pool
# and cache block per module (memory tests, what each size holds), the stream tests on the shared caches.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 150 python3 -m pytest -q -p no:logging --tb=short tests/test_wan_fused_norm_conv.py -k "past_32_bit" \
  tests/test_gpu_wan.py::test_1080p_bit_identical 2>&1 | tail -15 | tee $OUT/tests_1080p.log
timeout 200 python3 -m pytest -q -p no:logging --tb=short --durations=8 tests/test_gpu_memory.py 2>&1 | tail -20 \
  | tee $OUT/tests_memory.log
timeout 60 python3 docs/data/experiments/s23_graph_memory_by_size.py lossless 2>&1 | tail -6 | tee $OUT/sizes.log
timeout 200 rewrite-bench --size 1088x1920 --frames 21 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/bench_1080p_21.json 2>&1 | tail -8 | tee $OUT/bench_1080p.log
