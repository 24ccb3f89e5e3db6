#!/usr/bin/env bash
# Written in session 35, not run yet (issue 40): the checks the shipped F(4x4, 3x3) route still lacks, in order of
# need, on one H100: (1) Wan 2.2 720x1280x81 `off` / `channels_last` as shipped (banded temporaries: time and peak
# against `off`'s); (2) the full-size contract tests for Wan 2.2 at 480p and 720p; (3) Wan 2.2 704x1280x121;
# (4) F(4x4, 3x3) on Wan 2.1's layers (720p and 1080p), against cuDNN and the direct conv. About 9 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 150 rewrite-bench --model wan2.2 --size 720x1280 --frames 81 --levels off,channels_last --repeat 2 \
  --json $OUT/wan22_720x1280x81_large_tile_banded_${card}.json 2>&1 | grep -v Warn | tail -3
timeout 150 python3 -m pytest -q -m gpu tests/models/wan/test_full_size_channels_last.py -k "wan2.2" 2>&1 | tail -3
timeout 120 rewrite-bench --model wan2.2 --size 704x1280 --frames 121 --levels off,channels_last --repeat 2 \
  --json $OUT/wan22_704x1280x121_large_tile_${card}.json 2>&1 | grep -v Warn | tail -3
timeout 150 python3 -m rewrite.tools.sweep_winograd --shapes wan21,wan21_1080 --groups large \
  --json $OUT/winograd_large_tile_wan21_${card}_bf16.json 2>&1 | grep -v Warn | tee $OUT/sweep_wan21.log | tail -40
