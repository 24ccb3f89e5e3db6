#!/usr/bin/env bash
# Written in session 39 for the next GPU call (issue 37's one target without a measurement on record): five sizes x
# two levels of full Wan 2.1 in one process, then a third module's first decode (`five_sizes_two_levels.py`), then
# issue 37's memory tests on the final code (they last ran at 09f30aa). About 8 minutes. Logs to $OUT.
. docs/data/experiments/gpu_setup.sh || exit 1
card=$(grep -o "H[12]00" $OUT/gpu.txt | head -1 | tr A-Z a-z)
timeout 330 python3 docs/data/experiments/five_sizes_two_levels.py $OUT/five_sizes_two_levels_${card}.json 2>&1 \
  | grep -v -i warn | grep -v "kept in float32" | tail -14
timeout 160 python3 -m pytest -m gpu -q tests/runtime/test_full_size_memory.py 2>&1 | tail -3 | tee $OUT/memory_tests.log
