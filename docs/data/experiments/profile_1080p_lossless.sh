#!/usr/bin/env bash
# Session 24, run 3: where Wan 2.1 1088x1920 `lossless` still spends its time after the norm pieces (an eager
# profile of one decode of 2 latent frames, kernels attributed to the op and source line that launched them).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>/dev/null || exit 1
timeout 170 python3 docs/data/experiments/eager_profile_by_launching_op.py wan2.1 1088x1920 5 lossless $OUT/profile_1080p.json \
  2>&1 | grep -v Warning | head -40
