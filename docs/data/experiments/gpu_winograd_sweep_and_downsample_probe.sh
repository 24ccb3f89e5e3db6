#!/usr/bin/env bash
# Written in session 28 for the next device run (not run yet): issue 40's first Winograd numbers (both forms'
# tiles against cuDNN and the direct conv per Wan shape) and issue 39's downsampler probe (the self-check's verdict
# for `rewrite::pad_conv2d` / `rewrite::time_conv` on this card, and what those convs cost alone).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 90 python3 docs/data/experiments/downsample_conv_probe.py 2>&1 | tail -8 | tee $OUT/downsample_probe.log
timeout 420 python3 -m rewrite.tools.sweep_winograd --shapes wan22,wan21 --json $OUT/winograd_sweep.json \
  > $OUT/winograd_sweep.log 2>&1; echo "rc $?"
grep -E "cudnn|direct|failed|winograd" $OUT/winograd_sweep.log | head -120
