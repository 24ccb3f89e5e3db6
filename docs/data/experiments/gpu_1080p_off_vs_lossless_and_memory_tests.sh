#!/usr/bin/env bash
# Session 25, run 1 (issue 37): where `off` and `lossless` differ at 1088x1920 (eager profiles side by side, conv
# call sites compared), Wan 2.1 81-frame benches at 1088x1920 and 720x1280 in one run, then the GPU tests that
# session 24 fixed but never re-ran (memory after del/off at both levels, several sizes, out of memory, 1080p).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 150 python3 docs/data/experiments/profile_off_vs_lossless.py wan2.1 1088x1920 5 $OUT/profile.json 2>&1 \
  | grep -v -i "warn\|USDT\|self.profiler" | tee $OUT/profile.log
timeout 170 rewrite-bench --size 1088x1920 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/bench_1088x1920x81.json 2>&1 | grep -v "decodes:" | tail -8 | tee $OUT/bench_1080p.log
timeout 100 rewrite-bench --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/bench_720x1280x81.json 2>&1 | grep -v "decodes:" | tail -8 | tee $OUT/bench_720p.log
timeout 150 python3 -m pytest -q -p no:logging --tb=short --durations=6 tests/test_gpu_memory.py \
  "tests/test_gpu_wan.py::test_1080p_bit_identical[1088x1920-wan2.1]" 2>&1 | tail -15 | tee $OUT/tests.log
