#!/usr/bin/env bash
# Session 25, run 2 (issue 37): the 1080p `lossless` ratio under CUDA graphs (kernel time by category and SM
# clock/power of `off` and `lossless` at 1088x1920x21 and 720x1280x21, graphs replayed), and why the
# out-of-memory test's result differed from the reference computed before its memory cap.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
for size in 1088x1920 720x1280; do
  GRAPHS=1 timeout 200 python3 docs/data/experiments/profile_off_vs_lossless.py wan2.1 $size 21 $OUT/graphs_$size.json \
    2>&1 | grep -v -i "warn\|USDT\|self.profiler" | head -32 | tee $OUT/graphs_$size.log
done
timeout 120 python3 docs/data/experiments/out_of_memory_then_reference.py 2>&1 | grep -v -i "warn\|float32" \
  | tee $OUT/oom_probe.log
