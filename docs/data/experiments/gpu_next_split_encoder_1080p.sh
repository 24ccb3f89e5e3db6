#!/usr/bin/env bash
# Written in session 29 for the next device call (not run yet), about 9 minutes: issue 40's split Winograd form
# against the one-loop form, issue 39's encoder conv shapes (Triton tiles against cuDNN), issue 37's 192-channel
# convs 960 wide on cuDNN at 1088x1920 (decode level), each logged to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 150 python3 -m rewrite.tools.sweep_winograd --shapes wan22 --groups split,one_loop --max-tiles 7 \
  --json $OUT/winograd_split.json > $OUT/winograd_split.log 2>&1; echo "rc $?"
grep -v Warn $OUT/winograd_split.log
timeout 150 python3 -m rewrite.tools.sweep_conv3d --shapes wan21enc,wan22enc --max-tiles 8 \
  --json $OUT/conv3d_encoder.json > $OUT/conv3d_encoder.log 2>&1; echo "rc $?"
grep -v "^  (" $OUT/conv3d_encoder.log | head -20
for v in off current cudnn192; do
  timeout 80 python3 docs/data/experiments/wan21_1080p_tile_variants.py $v 21 $OUT/variant_$v.json 2>&1 | tail -1
done
