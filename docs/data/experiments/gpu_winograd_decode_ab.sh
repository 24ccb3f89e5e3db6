#!/usr/bin/env bash
# Written in session 32 (issue 40 item 2; session 36: candidates merged per card, the shipped entries kept): Wan 2.2
# 720x1280x81 decodes on an H100, first as shipped (off, lossless, channels_last: Winograd routes nothing), then
# channels_last with the split Winograd conv routed for the sweep's winners (`winograd.common.UNMEASURED_CANDIDATES`:
# 1024 -> 1024 at 90x160), with off again as the reference of its ratio and contract columns. If the second is faster
# within the contract (PSNR >= 45 dB, the max-abs bound), move the entry into `_MEASURED_FASTER`. About 4 minutes.
# Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 130 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,lossless,channels_last \
  --json $OUT/decode_wan22_720x1280x81.json 2>&1 | grep -v Warn | tail -4
timeout 110 python3 -c "
import sys
from rewrite.kernels.winograd import common
for card, entries in common.UNMEASURED_CANDIDATES.items():
    common._MEASURED_FASTER.setdefault(card, {}).update(entries)
from rewrite.tools.bench import main
sys.exit(main(sys.argv[1:]))" --model wan2.2 --size 720x1280 --frames 81 --levels off,channels_last \
  --json $OUT/decode_wan22_720x1280x81_with_winograd.json 2>&1 | grep -v Warn | tail -3
