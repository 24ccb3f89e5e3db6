#!/usr/bin/env bash
# Session 24, run 1: the 1080p cliff (norms past 32-bit indexing): the norm tests against ATen, 1080p decodes
# bit-identical, and a 1088x1920x21 bench at the three levels.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 300 python3 -m pytest -q -p no:logging --tb=short --durations=6 tests/test_wan_fused_norm_conv.py \
  -k "past_32_bit" tests/test_gpu_wan.py::test_1080p_bit_identical 2>&1 | tail -15 | tee $OUT/tests_1080p.log
timeout 200 rewrite-bench --size 1088x1920 --frames 21 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/bench_1080p_21.json 2>&1 | tail -8 | tee $OUT/bench_1080p.log
