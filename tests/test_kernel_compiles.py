"""The Triton kernels compile for an H100/H200 (sm_90) on a machine without a GPU.

The interpreter (the CPU tests) runs kernels as Python and accepts code that Triton's compiler rejects
(e.g. a `None` flowing into arithmetic in a branch the compiler still builds), so this compiles them to a
cubin: Triton ships its own ptxas, no driver is needed. It runs in a subprocess because the test session
may have set ``TRITON_INTERPRET=1``, under which ``triton.jit`` makes interpreted functions only.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

COMPILE_ALIAS_FREE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from rewrite.ops import alias_free

pointers = ("x_ptr", "x_bias_ptr", "alpha_ptr", "beta_ptr", "taps_ptr", "out_ptr")
ints = ("rows", "channels", "T", "t_blocks", "x_row_stride", "out_row_stride", "out_offset")
flags = ("LOGSCALE", "HAS_X_BIAS", "BLOCK_R", "BLOCK_T", "HALO_T", "ZEROS_BLOCK")
for dtype, has_bias, zeros in (("fp32", True, 16), ("bf16", False, 0), ("fp16", True, 0)):
    signature = {**{p: "*" + dtype for p in pointers}, **{i: "i32" for i in ints}, **{f: "constexpr" for f in flags}}
    constants = {"LOGSCALE": True, "HAS_X_BIAS": has_bias, "BLOCK_R": 4, "BLOCK_T": 64, "HALO_T": 8, "ZEROS_BLOCK": zeros}
    kernel = triton.compile(ASTSource(alias_free._alias_free_snake_kernel, signature, constexprs=constants),
                            target=GPUTarget("cuda", 90, 32))
    assert kernel.asm["cubin"], (dtype, has_bias, zeros)
print("compiled")
"""


def test_alias_free_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", COMPILE_ALIAS_FREE], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]
