"""Triton device functions that must compute what ATen's CUDA kernels compute, shared by every kernel.

`exp` and `sin` are libdevice's `expf`/`sinf` (the functions ATen's CUDA kernels call, so results are
bit-identical); under the CPU interpreter, which does not provide libdevice, they are numpy's. `round_to`
converts fp32 to a narrower dtype rounding to nearest even, as ATen does; the interpreter truncates to
bf16, so there the rounding is done on the bits first (NaN/inf are not expected in interpreter tests).
`round_tf32` rounds fp32 to the nearest TF32 value (ties away from zero, as ``cvt.rna.tf32.f32``), for
operands a TF32 tensor-core product would otherwise truncate.
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

    @triton.jit
    def round_tf32(y):
        """fp32 ``y`` rounded to the nearest value with a 10-bit mantissa (TF32), ties away from zero; inf and
        NaN unchanged. The tensor cores then multiply it exactly (they ignore the 13 low mantissa bits)."""
        bits = y.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x1000) & 0xFFFFE000
        rounded = tl.where((bits & 0x7F800000) == 0x7F800000, bits, rounded)
        return rounded.to(tl.float32, bitcast=True)
