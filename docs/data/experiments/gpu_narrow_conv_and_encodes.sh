#!/usr/bin/env bash
# Session 30, issue 39: the encoders' first conv on the Triton conv (`causal_conv3d_fast`) and the H100's own
# encoder conv choices (`conv3d.CARD_FASTER_THAN_CUDNN`): the op probe, its tests on CUDA, the channels_last encode
# tests, then Wan 2.1 720x1280x81's encode at three levels. Logs to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 python3 docs/data/experiments/narrow_conv_probe.py $OUT/narrow_conv_probe.json 2>&1 | grep -v Warn
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/models/wan/test_causal_conv_fast.py \
  "tests/models/wan/test_full_size_encodes.py" -k "causal_conv_fast or channels_last" 2>&1 | tail -5
timeout 220 rewrite-bench --model wan2.1 --encode --size 720x1280 --frames 81 --levels off,lossless,channels_last \
  --json $OUT/encode_wan21_720x1280x81.json 2>&1 | grep -v Warn | tail -5
timeout 120 rewrite-bench --model wan2.1 --encode --size 480x832 --frames 81 --levels off,lossless,channels_last \
  --json $OUT/encode_wan21_480x832x81.json 2>&1 | grep -v Warn | tail -4
timeout 150 rewrite-bench --model wan2.2 --encode --size 704x1280 --frames 121 --levels off,lossless,channels_last \
  --json $OUT/encode_wan22_704x1280x121.json 2>&1 | grep -v Warn | tail -4
