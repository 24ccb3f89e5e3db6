#!/usr/bin/env bash
# Written in session 31, extended in session 32, not run yet: the static caches' layout fix also gives two of the
# decoder's caches (read for their sizes) channels-last buffers on the tiny CPU capture, and session 32 routes Wan
# 2.2's 1024-channel convs at 90x160 to the split Winograd conv on the H100 (`winograd.common._MEASURED_FASTER`).
# The full-size decode tests (lossless bit-identical), Wan 2.2 720p at three levels, its channels_last once more
# with the Winograd table emptied (the A/B of the routing, same warm card). Logs to $OUT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/models/wan/test_full_size_decodes.py 2>&1 | tail -3
timeout 130 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,lossless,channels_last \
  --json $OUT/decode_wan22_720x1280x81.json 2>&1 | grep -v Warn | tail -4
timeout 80 python3 -c "
import sys
from rewrite.kernels.winograd import common
common._MEASURED_FASTER.clear()
from rewrite.tools.bench import main
sys.exit(main(sys.argv[1:]))" --model wan2.2 --size 720x1280 --frames 81 --levels channels_last \
  --json $OUT/decode_wan22_720x1280x81_channels_last_without_winograd.json 2>&1 | grep -v Warn | tail -3
