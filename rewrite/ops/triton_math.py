"""Triton device functions that must compute what ATen's CUDA kernels compute, shared by every kernel.

`exp` and `sin` are libdevice's `expf`/`sinf` (the functions ATen's CUDA kernels call, so results are
bit-identical); under the CPU interpreter, which does not provide libdevice, they are numpy's. `round_to`
converts fp32 to a narrower dtype rounding to nearest even, as ATen does; the interpreter truncates to
bf16, so there the rounding is done on the bits first (NaN/inf are not expected in interpreter tests).
"""

from __future__ import annotations

from rewrite.ops.dispatch import INTERPRETING, triton

if triton is not None:
    import triton.language as tl

    try:
        from triton.language.extra import libdevice
    except ImportError:  # pragma: no cover - older triton layouts
        from triton.language.extra.cuda import libdevice

    _INTERPRET = tl.constexpr(INTERPRETING)

    @triton.jit
    def exp(x):
        if _INTERPRET:
            return tl.exp(x)
        else:
            return libdevice.exp(x)

    @triton.jit
    def sin(x):
        if _INTERPRET:
            return tl.sin(x)
        else:
            return libdevice.sin(x)

    @triton.jit
    def round_to(y, dtype: tl.constexpr):
        if _INTERPRET and dtype == tl.bfloat16:
            bits = y.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            y = bits.to(tl.float32, bitcast=True)
        return y.to(dtype)
