#!/usr/bin/env bash
# Session 30, issue 39, the short form of gpu_folded_first_conv.sh for the device time left: the first-conv probe
# (folded against widened against the lossless op) and Wan 2.1's encode at 720x1280x81, three levels. Logs to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 70 python3 docs/data/experiments/narrow_conv_probe.py $OUT/narrow_conv_probe.json 2>&1 | grep -v Warn
timeout 100 rewrite-bench --model wan2.1 --encode --size 720x1280 --frames 81 --levels off,lossless,channels_last \
  --json $OUT/encode_wan21_720x1280x81.json 2>&1 | grep -v Warn | tail -4
timeout 45 python3 -m pytest -q -p no:cacheprovider tests/models/wan/test_causal_conv_fast.py 2>&1 | tail -2
