#!/usr/bin/env bash
# Session 33's second GPU call (issue 39): the full-size encode tests after the cache layout fix and the epilogue
# refactors (2bd7c46 and the next commit), Wan 2.1 480x832x81 at three levels, then where Wan 2.2's 704p channels_last encode spends
# its time: the captured profile at 21 frames and the eager one by launching op (which ATen kernels are the
# shortcuts' pad / permute / mean / add, which are cache copies). About 9 minutes on an H100. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 240 python3 -m pytest -q -p no:cacheprovider -rA tests/models/wan/test_full_size_encodes.py 2>&1 \
  | grep -E "latents:|passed|failed|Error" | cut -c1-300
timeout 90 rewrite-bench --model wan2.1 --encode --size 480x832 --frames 81 --levels off,lossless,channels_last \
  --json $OUT/encode_wan21_480x832x81.json 2>&1 | grep -v Warn | tail -4
timeout 100 rewrite-bench --model wan2.2 --encode --size 704x1280 --frames 21 --levels channels_last --profile \
  --profile-rows 30 2>&1 | grep -v Warn > $OUT/encode_wan22_704x1280x21_channels_last.log
tail -36 $OUT/encode_wan22_704x1280x21_channels_last.log | cut -c1-60,150-230
timeout 120 python3 docs/data/experiments/eager_profile_by_launching_op.py wan2.2 704x1280 21 channels_last \
  $OUT/encode_wan22_704x1280x21_channels_last_eager_by_op.json encode 2>&1 | grep -v Warn | tail -30 | cut -c1-200
