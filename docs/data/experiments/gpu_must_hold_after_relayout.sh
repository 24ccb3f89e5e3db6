#!/usr/bin/env bash
# Session 27, run 1 (issue 38's Must hold, issue 40 item 3's bound on the GPU): Wan's full-size channels_last
# decodes (with rewrite.contract) and Qwen-Image's full-size decodes, not run since the re-layout; then Qwen-Image
# 1328x1328 off/lossless with single-frame decodes on chunk 0's CUDA graphs alone (peaks, graph memory).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 400 python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=0 \
  tests/models/wan/test_full_size_channels_last.py tests/models/qwenimage/test_full_size_decodes.py > $OUT/pytest.log 2>&1
echo "pytest rc $?"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|PSNR|Error" $OUT/pytest.log | tail -40
timeout 150 rewrite-bench --model qwenimage --size 1328x1328 --frames 1 --levels off,lossless,channels_last --repeat 3 \
  --json $OUT/qwenimage_1328x1328.json 2>&1 | grep -v "decodes:" | tail -12 | tee $OUT/bench.log
