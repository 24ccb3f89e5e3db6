#!/usr/bin/env bash
# Session 26, run 3 (issue 37 item 4; issue 38's Must hold): the size sweep at 81 frames, `off` and `lossless`
# (the sweep's targets are `lossless` ones), Wan 2.1 then Wan 2.2, largest sizes first so a cut run keeps them;
# then Wan 2.1 720x1280x21 `off`/`channels_last` after the typed pattern parameters (graphs unchanged on CPU).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
SIZES=1088x1920,1920x1088,720x1280,704x1280,480x832,832x480
for model in wan2.1 wan2.2; do
  limit=$([ $model = wan2.1 ] && echo 250 || echo 265)
  timeout $limit python3 -m rewrite.tools.sweep_sizes --models $model --sizes $SIZES --frames 81 --levels off,lossless \
    --repeat 1 --json $OUT/size_sweep_${model/./}_81_frames.json > $OUT/sweep_$model.log 2>&1
  grep -E "^(wan|off|lossless)|BELOW|meets|Error" $OUT/sweep_$model.log | tail -24
done
timeout 60 rewrite-bench --size 720x1280 --frames 21 --levels off,channels_last --repeat 2 --warmup 0 \
  --json $OUT/wan21_720x1280x21_channels_last.json 2>&1 | grep -v "decodes:" | tail -4
