#!/usr/bin/env bash
# Session 26, run 4 (issue 37 item 4): the size the run-3 sweep's limits cut, 832x480 at 81 frames, both Wan models.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m rewrite.tools.sweep_sizes --models wan2.1,wan2.2 --sizes 832x480 --frames 81 --levels off,lossless \
  --repeat 1 --json $OUT/size_sweep_832x480_81_frames.json 2>&1 | grep -E "^(wan|off|lossless)|BELOW|meets|Error" | tail -12
