#!/usr/bin/env bash
# Session 24, one run for everything (device starts were scarce): the 1080p cliff (the norm tests against ATen
# past 32-bit indexing, a 1088x1920 decode bit-identical, a 1088x1920x21 bench at three levels), one graph pool
# and cache block per module (sizes within 1.3x of the largest, memory back on delete, a real out-of-memory
# fallback), AuK channels_last in half precision against its contract.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 150 python3 -m pytest -q -p no:logging --tb=short --durations=4 tests/test_wan_fused_norm_conv.py \
  -k "past_32_bit" "tests/test_gpu_wan.py::test_1080p_bit_identical[1088x1920-wan2.1]" 2>&1 | tail -12 \
  | tee $OUT/tests_1080p.log
timeout 200 python3 -m pytest -q -p no:logging --tb=short --durations=4 tests/test_gpu_memory.py \
  -k "several_sizes or (del and lossless) or out_of_memory" 2>&1 | tail -12 | tee $OUT/tests_memory.log
timeout 60 python3 -m pytest -q -s -p no:logging --tb=short tests/test_gpu_auk_runtime.py -k half_precision 2>&1 \
  | grep -E "clip|passed|failed|Error" | tee $OUT/tests_auk_half.log
timeout 150 rewrite-bench --size 1088x1920 --frames 21 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/bench_1080p_21.json 2>&1 | grep -v "decodes:" | tail -8 | tee $OUT/bench_1080p.log
