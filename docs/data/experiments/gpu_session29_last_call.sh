#!/usr/bin/env bash
# Session 29's last device call (about 6 minutes): the downsampler ops with the Triton pad (issue 39), the
# materialized Winograd form's one-loop tiles and time breakdown (issue 40), the H100's CARD_TILES at 1088x1920
# against launch_config's rule (issue 37).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 60 python3 docs/data/experiments/downsample_conv_probe.py 2>&1 | tail -6 | tee $OUT/downsample_probe.log
timeout 110 python3 -m rewrite.tools.sweep_winograd --shapes wan22 --groups one_loop,materialized --max-tiles 8 \
  --json $OUT/winograd_one_loop.json > $OUT/winograd_one_loop.log 2>&1; echo "rc $?"
grep -v Warn $OUT/winograd_one_loop.log
variants="rule current"
grep -q H100 $OUT/gpu.txt || variants="current"
for v in $variants; do
  timeout 75 python3 docs/data/experiments/wan21_1080p_tile_variants.py $v 21 $OUT/variant_$v.json 2>&1 | tail -1
done
