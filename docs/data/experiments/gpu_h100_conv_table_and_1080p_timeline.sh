#!/usr/bin/env bash
# Session 29, issue 37: item 6's H100 conv3d sweep for the shapes the Winograd sweep did not time (heads, 480p, the
# upsamplers' convs), and item 4's graph-replay timelines of Wan 2.1 `channels_last` at 1088x1920 and 720x1280.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 200 python3 -m rewrite.tools.sweep_conv3d --shapes head,wan21_480,wan21up --json $OUT/conv3d_sweep.json \
  > $OUT/conv3d_sweep.log 2>&1; echo "sweep rc $?"
grep -vE "^\s+\(" $OUT/conv3d_sweep.log | head -40
for size in 1088x1920 720x1280; do
  timeout 170 python3 docs/data/experiments/graph_replay_timeline.py wan2.1 $size 21 channels_last \
    $OUT/timeline_wan21_${size}x21_cl.json 2>&1 | tail -30
done
