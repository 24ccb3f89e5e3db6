#!/usr/bin/env bash
# Session 26, run 1 (issues 37, 38): the out-of-memory GPU test with its whole failure text and the probe beside
# it; Qwen-Image 1328x1328 (bf16, one image) at three levels and Qwen's GPU tests; the GPU tests of the kernels,
# ops and AuK after the re-layout (issue 38's Must hold, first half).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 100 python3 -m pytest -q -p no:logging --tb=long -x -m gpu tests/runtime/test_full_size_memory.py \
  -k out_of_memory > $OUT/oom_test.log 2>&1; tail -3 $OUT/oom_test.log
timeout 100 python3 docs/data/experiments/out_of_memory_then_reference.py > $OUT/oom_probe.log 2>&1; tail -8 $OUT/oom_probe.log
timeout 200 rewrite-bench --model qwenimage --size 1328x1328 --frames 1 --levels off,lossless,channels_last \
  --repeat 3 --json $OUT/qwenimage_1328x1328.json 2>&1 | grep -v "decodes:" | tail -6 | tee -a $OUT/bench.log
timeout 150 python3 -m pytest -q -p no:logging --tb=short --durations=3 -m gpu tests/models/qwenimage \
  2>&1 | tail -8 | tee $OUT/qwen_tests.log
timeout 240 python3 -m pytest -q -p no:logging --tb=short --durations=5 -m gpu tests/kernels tests/ops \
  tests/models/auk tests/models/wan/test_ops.py tests/models/wan/test_ops_fast.py tests/models/wan/test_fused_ops.py \
  tests/models/wan/test_chain_block_norms.py tests/models/wan/test_pointwise_conv.py 2>&1 | tail -15 | tee $OUT/tests_gpu.log
