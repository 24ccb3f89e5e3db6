#!/usr/bin/env bash
# Session 28, run 1 (issue 38's Must hold, the part left): the four full-size two-rank gloo tests of
# tests/models/wan/distributed/test_decode_sharded.py on one GPU, first since the re-layout.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 545 python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=0 tests/models/wan/distributed \
  > $OUT/pytest_distributed.log 2>&1; echo "rc $?"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Error|s call" $OUT/pytest_distributed.log | tail -20
# Run 3 (the same machine, after run 2): the fourth test alone, which run 1's limit cut off.
#   timeout 400 python3 -m pytest -m gpu -p no:cacheprovider -rA --durations=0 tests/models/wan/distributed -k wan2.2-720p
