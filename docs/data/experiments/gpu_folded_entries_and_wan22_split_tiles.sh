#!/usr/bin/env bash
# Session 31, issue 39: Wan 2.1's 720x1280x81 encode with the folded first conv chosen on the H100; the Triton conv's
# channel-split tiles for Wan 2.2's encoder widths (160 = 128 + 32, 160 -> 320 and 320 in 256 + 64 or 64-channel
# blocks) against cuDNN; where the channels_last encodes spend their time (Wan 2.2 704x1280x21, Wan 2.1 720x1280x21,
# one call each). Logs to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 rewrite-bench --model wan2.1 --encode --size 720x1280 --frames 81 --levels off,channels_last \
  --json $OUT/encode_wan21_720x1280x81.json 2>&1 | grep -v Warn | tail -3
timeout 240 python3 -m rewrite.tools.sweep_conv3d --shapes wan22enc --only "160 @,160->320,320 @" --max-tiles 14 \
  --json $OUT/conv3d_wan22_encoder_splits.json 2>&1 | tee $OUT/conv3d_wan22_encoder_splits.log | grep -v "^  " 
python3 - $OUT/conv3d_wan22_encoder_splits.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    best = min(r["tiles"], key=lambda t: t["ms"])
    print(r["shape"], "cudnn %.3f ms" % r["cudnn_ms"], "best", best["tile"], "%.3f ms %.0f TFLOP/s" % (best["ms"], best["tflops"]))
PY
timeout 90 rewrite-bench --model wan2.2 --encode --size 704x1280 --frames 21 --levels channels_last --repeat 1 \
  --warmup 0 --profile --profile-rows 25 > $OUT/encode_wan22_profile_704x1280x21.log 2>&1
grep -v "decodes:" $OUT/encode_wan22_profile_704x1280x21.log | cut -c1-180 | tail -32
timeout 90 rewrite-bench --model wan2.1 --encode --size 720x1280 --frames 21 --levels channels_last --repeat 1 \
  --warmup 0 --profile --profile-rows 25 > $OUT/encode_wan21_profile_720x1280x21.log 2>&1
grep -v "decodes:" $OUT/encode_wan21_profile_720x1280x21.log | cut -c1-180 | tail -32
timeout 150 python3 docs/data/experiments/bench_with_swept_tiles.py $OUT/conv3d_wan22_encoder_splits.json 0.03 -- \
  --model wan2.2 --encode --size 704x1280 --frames 121 --levels off,channels_last \
  --json $OUT/encode_wan22_704x1280x121_split_tiles.json 2>&1 | grep -v Warn | tail -5
