#!/usr/bin/env bash
# Session 29: issue 37 item 4 (Wan 2.1 1088x1920x21 `channels_last` with the H100 sweep's tiles, one process per
# variant, against `off`), issue 40 (the materialized Winograd form with its 16 point GEMMs as one loop, and
# where its time goes: the input transform alone and the GEMM core as torch.bmm) and issue 39 (the encoders'
# conv shapes that have no Triton conv entry: Triton tiles against cuDNN).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
variants="off rule current cudnn192"
grep -q H100 $OUT/gpu.txt || variants="off current cudnn192"  # CARD_TILES holds the H100's only
for v in $variants; do
  timeout 90 python3 docs/data/experiments/wan21_1080p_tile_variants.py $v 21 $OUT/variant_$v.json 2>&1 | tail -1
done
timeout 130 python3 -m rewrite.tools.sweep_winograd --shapes wan22 --groups materialized,one_loop \
  --json $OUT/winograd_one_loop.json > $OUT/winograd_one_loop.log 2>&1; echo "rc $?"
grep -v Warn $OUT/winograd_one_loop.log
timeout 120 python3 -m rewrite.tools.sweep_conv3d --shapes wan21enc,wan22enc --max-tiles 8 \
  --json $OUT/conv3d_encoder.json > $OUT/conv3d_encoder.log 2>&1; echo "rc $?"
grep -v "^  (" $OUT/conv3d_encoder.log | head -20
