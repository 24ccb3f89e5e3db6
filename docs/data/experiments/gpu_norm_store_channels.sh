#!/usr/bin/env bash
# Session 25, run 4 (issue 37): the fused norm with 16+ channels per store step and 16 channels in flight where
# one thread sums each output (the 1088x1920 norms, split 1: the graph timeline showed them at 678 ms of a
# 1.86 s decode). The norm tests against ATen, the 1080p decode bit-identical, benches at 1080p and 720p, and the
# out-of-memory test compared with the reference after its episode.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 170 python3 -m pytest -q -p no:logging --tb=short -m gpu tests/test_wan_fused_norm_conv.py tests/test_norm_fast.py \
  "tests/test_gpu_wan.py::test_1080p_bit_identical[1088x1920-wan2.1]" 2>&1 | tail -6 | tee $OUT/tests_norm.log
timeout 100 rewrite-bench --size 1088x1920 --frames 21 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/bench_1088x1920x21.json 2>&1 | grep -v "decodes:" | tail -5 | tee $OUT/bench.log
timeout 70 rewrite-bench --size 720x1280 --frames 21 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/bench_720x1280x21.json 2>&1 | grep -v "decodes:" | tail -5 | tee -a $OUT/bench.log
timeout 80 python3 -m pytest -q -p no:logging --tb=short tests/test_gpu_memory.py -k out_of_memory 2>&1 | tail -3 \
  | tee $OUT/tests_oom.log
