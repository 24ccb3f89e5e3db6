#!/usr/bin/env bash
# Session 23, run 1: the GPU tests of what issue 36 touched (the alias-free op's CUDA path, AuK, options and
# latents on CUDA), the streaming fix of session 22 (never run on a GPU), and the memory probe of issue 37.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 200 python3 docs/data/experiments/memory_after_delete_probe.py lossless channels_last > $OUT/memory_probe.log 2>&1
tail -5 $OUT/memory_probe.log
timeout 330 python3 -m pytest -q -p no:logging --tb=short --durations=5 -m gpu tests/test_alias_free_op.py \
  tests/test_gpu_auk.py tests/test_gpu_auk_runtime.py tests/test_auk_exact_kernels.py tests/test_stream.py \
  tests/test_gpu_contract.py 2>&1 | tail -15 | tee $OUT/tests_gpu.log
