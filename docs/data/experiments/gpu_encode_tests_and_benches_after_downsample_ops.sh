#!/usr/bin/env bash
# Session 28, run 2 (issue 39): the full-size encode GPU tests (never run yet) and the encode benches at issue 39's
# sizes after the downsamplers became exact channels-last ops (rewrite::pad_conv2d, rewrite::time_conv).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 240 python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=0 tests/models/wan/test_full_size_encodes.py \
  > $OUT/pytest_encodes.log 2>&1; echo "rc $?"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Error|latents:|s call" $OUT/pytest_encodes.log | tail -24
timeout 85 rewrite-bench --encode --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/encode_wan21_720x1280x81.json 2>&1 | grep -v "decodes:" | tail -5
timeout 110 rewrite-bench --encode --model wan2.2 --size 704x1280 --frames 121 --levels off,lossless,channels_last \
  --repeat 1 --warmup 0 --json $OUT/encode_wan22_704x1280x121.json 2>&1 | grep -v "decodes:" | tail -5
timeout 80 rewrite-bench --encode --size 480x832 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 \
  --json $OUT/encode_wan21_480x832x81.json 2>&1 | grep -v "decodes:" | tail -5
