#!/usr/bin/env bash
# Written in session 38 (issues 40 and 37), for the H100 (Wan 2.1's seven F(4x4, 3x3) entries; another card has
# none): the full-size Wan 2.1 contract tests as shipped, Wan 2.1 480x832x81 `off` against `channels_last` with the
# sweep's 480p winners routed (then in `common.UNMEASURED_CANDIDATES`: no decode had run with them), the 96-channel
# conv swept, then 720x1280x81 as shipped. About 7 minutes. Logs to $OUT. (Run in session 38 without its last step,
# by gpu_winograd_either_card.sh. The direct conv serves those entries' shapes and runs first, so no Winograd conv
# ran: the table keeps Wan 2.1's 1080p 192-channel entry only, the rest wait as candidates; tuning.md 1.28.)
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 170 python3 -m pytest -m gpu -q tests/models/wan/test_full_size_channels_last.py -k wan2.1 2>&1 | tail -3 \
  | tee $OUT/full_size_wan21.log
timeout 120 python3 docs/data/experiments/bench_with_winograd_winners.py \
  docs/data/sweeps/winograd_large_tile_wan21_h100_bf16.json 1.05 -- --model wan2.1 --size 480x832 --frames 81 \
  --repeat 2 --levels off,channels_last --json $OUT/wan21_480x832x81_winograd_winners_${card}.json 2>&1 \
  | grep -v Warn | grep -v decodes | tail -12
# Then Wan 2.1's 96-channel 720p conv by F(4x4, 3x3) (the direct conv runs it at 487 TFLOP/s; K = 288 per point).
timeout 60 python3 -m rewrite.tools.sweep_winograd --shapes wan21 --only 96 --groups large --max-tiles 2 --core \
  --json $OUT/winograd_large_tile_wan21_96_${card}_bf16.json 2>&1 | grep -v Warn | tail -6
timeout 120 rewrite-bench --model wan2.1 --size 720x1280 --frames 81 --repeat 2 --levels off,channels_last \
  --json $OUT/wan21_720x1280x81_shipped_${card}.json 2>&1 | grep -v Warn | grep -v decodes | tail -3
