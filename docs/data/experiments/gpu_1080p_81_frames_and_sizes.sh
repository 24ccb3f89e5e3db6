#!/usr/bin/env bash
# Session 25, run 5 (issue 37): with the norm store tiling final (16 channels a step only where the first pass
# used fewer: 720p unchanged), the out-of-memory test with its whole output, Wan 2.1 720x1280x21 and
# 1088x1920x81 at three levels, and two more sizes of the sweep at 21 frames (device time left: no 81-frame sweep).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 60 python3 -m pytest -q -p no:logging --tb=line tests/test_gpu_memory.py -k out_of_memory 2>&1 \
  | grep -v "^E   *tensor\|^ *[-0-9.e+]*,\|\.\.\." | tail -25 | tee $OUT/tests_oom.log
timeout 70 rewrite-bench --size 720x1280 --frames 21 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/bench_720x1280x21.json 2>&1 | grep -v "decodes:" | tail -5 | tee $OUT/bench.log
timeout 170 rewrite-bench --size 1088x1920 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/bench_1088x1920x81.json 2>&1 | grep -v "decodes:" | tail -5 | tee -a $OUT/bench.log
timeout 150 python3 -m rewrite.tools.sweep_sizes --models wan2.1 --sizes 1920x1088,480x832 --frames 21 \
  --levels off,lossless --repeat 1 --json $OUT/sweep_wan21_21_frames.json 2>&1 | grep -v "decodes:" | tail -12 \
  | tee $OUT/sweep.log
