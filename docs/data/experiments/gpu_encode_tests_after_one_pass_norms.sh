#!/usr/bin/env bash
# Session 34's last call: with the one-pass norms at Wan 2.2's encoder widths and the H100's Winograd entry shipped,
# the full-size encode tests that touch them (Wan 2.2 bit-identical at 480p and 720p, channels_last within the
# contract on the latents and the decoded video at 480p and 704p, an encode and a decode in one graph memory), the
# Winograd op's GPU tests, then Wan 2.1's 480x832x81 encode at three levels (issue 39's third row). About 8
# minutes on an H100. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
timeout 330 python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/models/wan/test_full_size_encodes.py \
  -k "wan2.2 or share" 2>&1 | grep -E "latents:|passed|failed|Error" | tail -12
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/models/wan/test_ops_fast_winograd.py 2>&1 | tail -2
timeout 120 rewrite-bench --model wan2.1 --encode --size 480x832 --frames 81 --levels off,lossless,channels_last \
  --json $OUT/encode_wan21_480x832x81.json 2>&1 | grep -v Warn | tail -4
