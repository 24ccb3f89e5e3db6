# Sourced first by the GPU scripts (`. docs/data/experiments/gpu_setup.sh || exit 1`): on the device machine (torch
# 2.11, triton 3.6, no package index) installs the wheels `../shared/gpu/stage.sh` staged into .whl/ (carried with
# the call) and this checkout, and writes the card's name to $OUT/gpu.txt.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || return 1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
