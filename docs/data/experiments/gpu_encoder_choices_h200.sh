#!/usr/bin/env bash
# Session 30, issue 39, for an H200 (no H100 could be had): the first-conv probe, the encoders' conv sweep on this
# card, and Wan 2.1 720x1280x81 encodes with the H100's encoder entries given to this card and without. Logs to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 100 python3 docs/data/experiments/narrow_conv_probe.py $OUT/narrow_conv_probe.json 2>&1 | grep -v Warn
for v in off current added; do
  timeout 100 python3 docs/data/experiments/encode_first_conv_variants.py $v wan2.1 720x1280 81 \
    $OUT/encode_variant_$v.json 2>&1 | tail -1
done
timeout 170 python3 -m rewrite.tools.sweep_conv3d --shapes wan21enc,wan22enc --max-tiles 8 \
  --json $OUT/conv3d_encoder.json > $OUT/conv3d_encoder.log 2>&1; echo "rc $?"
grep -v "^  (" $OUT/conv3d_encoder.log | grep -v Warn | head -20
