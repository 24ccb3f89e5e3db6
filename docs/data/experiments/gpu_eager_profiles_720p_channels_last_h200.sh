#!/usr/bin/env bash
# Session 21, run 1: eager profiles (kernel -> launching op, shapes, source line) of Wan 2.1 and 2.2 720p
# channels_last, 21 frames.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 200 python3 .gpu/eager_profile_by_launching_op.py wan2.1 720x1280 21 channels_last $OUT/eager21.json 2>&1 | grep -v Warn | tee $OUT/eager21.log
timeout 250 python3 .gpu/eager_profile_by_launching_op.py wan2.2 720x1280 21 channels_last $OUT/eager22.json 2>&1 | grep -v Warn | tee $OUT/eager22.log
