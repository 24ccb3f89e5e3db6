#!/usr/bin/env bash
# Session 25, run 3 (issue 37): the GPU timeline of graph-replayed decodes (busy time, idle gaps and what the host
# did in them) at 1088x1920x21 and 720x1280x21 for `lossless` and `off`, then the out-of-memory probe.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 110 python3 docs/data/experiments/out_of_memory_then_reference.py 2>&1 | grep -v -i "warn\|float32" \
  | tee $OUT/oom_probe.log
for size in 1088x1920 720x1280; do for level in lossless off; do
  timeout 120 python3 docs/data/experiments/graph_replay_timeline.py wan2.1 $size 21 $level $OUT/timeline_${size}_$level.json \
    2>&1 | grep -v -i "warn\|USDT\|self.profiler\|float32" | head -30 | tee $OUT/timeline_${size}_$level.log
done; done
