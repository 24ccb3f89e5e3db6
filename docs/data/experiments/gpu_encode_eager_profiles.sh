#!/usr/bin/env bash
# Session 31, issue 39: the channels_last encode contract tests with the H100's new entries (the folded first conv
# at 720p, Wan 2.2's split tiles at 704x1280), then which ops launch the encodes' kernels (the element-wise kernels
# at 15% of Wan 2.1's and 9% of Wan 2.2's device time in the graph profiles): eager profiles by launching op.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
[ "$(cat $OUT/gpu.txt)" = "NVIDIA H100 80GB HBM3" ] && timeout 200 python3 -m pytest -q -p no:cacheprovider -rA tests/models/wan/test_full_size_encodes.py \
  -k "channels_last" 2>&1 | grep -E "latents:|passed|failed|Error" | cut -c1-300
for case in "wan2.1 720x1280" "wan2.2 704x1280"; do
  set -- $case
  timeout 120 python3 docs/data/experiments/eager_profile_by_launching_op.py $1 $2 21 channels_last \
    $OUT/encode_eager_by_op_${1/./}_$2.json encode 2>&1 | grep -v Warn | head -32 | cut -c1-330
done
