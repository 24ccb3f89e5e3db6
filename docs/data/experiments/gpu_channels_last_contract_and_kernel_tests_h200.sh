#!/usr/bin/env bash
# Session 22, run 1: the GPU tests at HEAD: channels_last full decodes within the contract (Wan 2.1 / 2.2,
# 480p / 720p, 81 frames), fp16 / fp32, two resolutions + weight reload; the Wan kernels per shape class; lossless
# two resolutions.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
timeout 330 python3 -m pytest -q -p no:logging --tb=line --durations=10 tests/test_gpu_wan_fast.py 2>&1 | tail -16 | tee $OUT/tests_fast.log
timeout 150 python3 -m pytest -q -p no:logging --tb=line tests/test_wan_kernels.py tests/test_wan_fused_norm_conv.py tests/test_wan_fast.py tests/test_wan_chain.py -m gpu 2>&1 | tail -4 | tee $OUT/tests_kernels.log
timeout 90 python3 -m pytest -q -p no:logging --tb=line tests/test_gpu_wan.py -k "two_resolutions" 2>&1 | tail -3 | tee $OUT/tests_lossless.log
