#!/usr/bin/env bash
# Session 27 (issue 38's Must hold, issue 40 item 3's bound, issue 39's first GPU encode), in priority order within
# one 10-minute call (device starts were scarce): Wan's full-size channels_last decodes (rewrite.contract),
# Qwen-Image's full-size decodes and its 1328x1328 bench with single-frame decodes on chunk 0's CUDA graph alone,
# the stream/session, first-call and remaining 1080p lossless tests, then a first encode bench at 480x832x81 (three levels).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
summary() { grep -E "^(PASSED|FAILED|ERROR)|passed|failed|PSNR|Error" "$1" | tail -${2:-20}; }
timeout 190 python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=0 \
  tests/models/wan/test_full_size_channels_last.py > $OUT/pytest_channels_last.log 2>&1; echo "rc $?"
summary $OUT/pytest_channels_last.log
timeout 60 python3 -m pytest -m gpu -p no:cacheprovider -rA tests/models/qwenimage/test_full_size_decodes.py \
  > $OUT/pytest_qwenimage.log 2>&1; echo "rc $?"; summary $OUT/pytest_qwenimage.log 8
timeout 45 rewrite-bench --model qwenimage --size 1328x1328 --frames 1 --levels off,lossless --repeat 3 \
  --json $OUT/qwenimage_1328x1328.json 2>&1 | grep -v "decodes:" | tail -8 | tee $OUT/bench_qwenimage.log
timeout 190 python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=0 \
  tests/models/wan/test_stream.py tests/api/test_first_call.py tests/models/wan/test_full_size_decodes.py \
  -k "stream or session or first_call or warmup or 1080p and not 1088x1920-wan2.1" > $OUT/pytest_rest.log 2>&1
echo "rc $?"; summary $OUT/pytest_rest.log 14
timeout 80 rewrite-bench --encode --size 480x832 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/encode_wan21_480x832x81.json 2>&1 | grep -v "decodes:" | tail -6 | tee $OUT/bench_encode.log
