#!/usr/bin/env bash
# Session 26, run 2 (issues 37, 38): the full-size memory tests with the out-of-memory test's new cap; the AuK
# GPU tests after the alias-free ops became custom_ops; Wan's full-size `lossless` decode tests (480p, 720p,
# other dtypes, two resolutions; 1080p ran in session 25) and the concurrent-caller tests after the re-layout.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
git log --oneline -1 | tee -a $OUT/gpu.txt
t() { timeout "$1" python3 -m pytest -q -p no:logging --tb=short --durations=4 -m gpu "${@:3}" > "$OUT/$2.log" 2>&1;
      echo "== $2"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/$2.log" | tail -6; }
t 170 memory_tests tests/runtime/test_full_size_memory.py
t 100 auk_tests tests/models/auk tests/kernels/alias_free
t 230 wan_lossless_full_size tests/models/wan/test_full_size_decodes.py -k "not 1080p"
t 80 concurrent_callers tests/runtime/test_concurrent_callers.py
