#!/usr/bin/env bash
# Session 22, run 4: the rest of `pytest -m gpu` at HEAD, part 2: AuK, the small kernels, first call, fakes,
# compile-ahead, distributed on one GPU.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 \
  && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . || exit 1
echo "code: $(cat .gpu/commit)"
timeout 420 python3 -m pytest -q -p no:logging --tb=short --durations=10 -m gpu tests/test_gpu_auk.py tests/test_gpu_auk_runtime.py tests/test_first_call.py tests/test_fakes.py tests/test_compile_ahead.py tests/test_alias_free_op.py tests/test_auk_exact_kernels.py tests/test_pointwise_conv.py tests/test_distributed.py 2>&1 | tail -16 | tee $OUT/tests_rest.log
timeout 120 python3 -m pytest -q -p no:logging --tb=short tests/test_attention_fast.py tests/test_wan_upsample_fast.py 2>&1 | tail -4 | tee $OUT/tests_attention_upsample.log
