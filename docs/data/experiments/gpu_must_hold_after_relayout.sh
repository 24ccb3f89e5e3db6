#!/usr/bin/env bash
# Session 27, run 1 (issue 38's Must hold, issue 40 item 3's bound on the GPU): the `gpu` tests not run since the
# re-layout: Wan's full-size channels_last decodes (with rewrite.contract), Qwen-Image's full-size decodes, the
# stream/session tests on the CUDA graphs and the first-call test.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 540 python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=0 \
  tests/models/wan/test_full_size_channels_last.py tests/models/qwenimage/test_full_size_decodes.py \
  tests/models/wan/test_stream.py tests/api/test_first_call.py > $OUT/pytest.log 2>&1
echo "pytest rc $?"; grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed|PSNR|Error" $OUT/pytest.log | tail -40
