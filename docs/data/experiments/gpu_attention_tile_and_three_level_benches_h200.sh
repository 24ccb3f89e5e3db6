#!/usr/bin/env bash
# Session 19, run 3: the chosen attention tile; Wan 2.1 720p (repeat 2) and 480p three-level benches; 720p
# channels_last with the attention left to SDPA (A/B); the attention tests on CUDA.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 230 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --levels off,lossless,channels_last --repeat 2 --warmup 0 --json $OUT/wan21_720.json 2>&1 | grep -v decodes | tee $OUT/bench720.log
timeout 60 python3 -m pytest -q tests/test_attention_fast.py 2>&1 | tail -2 | tee $OUT/tests.log
timeout 100 rewrite-bench --model wan2.1 --size 480x832 --frames 81 --levels off,lossless,channels_last --repeat 1 --warmup 0 --json $OUT/wan21_480.json 2>&1 | grep -v decodes | tee $OUT/bench480.log
timeout 80 python3 - <<'PY' 2>&1 | grep -v decodes | tee $OUT/bench720_sdpa.log
import os
from rewrite.ops import attention_fast
attention_fast._FASTER_THAN_SDPA = frozenset()  # A/B: the attention left to SDPA
from rewrite.tools import bench
bench.main(["--model", "wan2.1", "--size", "720x1280", "--frames", "81", "--levels", "channels_last", "--repeat", "1",
            "--warmup", "0", "--json", os.environ["OUT"] + "/wan21_720_sdpa.json"])
PY
