"""Triton device functions that must compute what ATen's CUDA kernels compute, shared by every kernel.

`exp` and `sin` are libdevice's `expf`/`sinf` (the functions ATen's CUDA kernels call, so results are
bit-identical); under the CPU interpreter, which does not provide libdevice, they are numpy's. `sin_fast` is
the hardware approximation (``sin.approx.f32``) after a range reduction, for kernels of the ``tolerance`` class. `round_to`
converts fp32 to a narrower dtype rounding to nearest even, as ATen does; the interpreter truncates to
bf16, so there the rounding is done on the bits first (NaN/inf are not expected in interpreter tests).
`round_tf32` rounds fp32 to the nearest TF32 value (ties away from zero, as ``cvt.rna.tf32.f32``), for
operands a TF32 tensor-core product would otherwise truncate. `dot` is the tensor-core product of the
``tolerance`` kernels, made exact under the interpreter.
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
    def dot(a, b, acc):
        """`tl.dot(a, b, acc)` with fp32 accumulation; the CPU interpreter multiplies bf16 tiles as their raw
        bits, so there the operands go through fp32 (exact) at IEEE precision."""
        if _INTERPRET:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            return tl.dot(a, b, acc)

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

    # 2*pi split so that k * _TWO_PI_HI is exact in fp32 for |k| < 2**15 (6.28125 = 201/32 has 8 significant bits)
    _INV_TWO_PI = tl.constexpr(0.15915494309189535)
    _TWO_PI_HI = tl.constexpr(6.28125)
    _TWO_PI_LO = tl.constexpr(0.0019353071795864769)

    @triton.jit
    def sin_fast(x):
        """sin(x) by the hardware's ``sin.approx.f32`` after a two-constant reduction into [-pi, pi]: absolute
        error about 2**-20.9 (PTX ISA) for |x| up to ~2e5, a few instructions where libdevice's ``sinf`` takes
        tens. Not bit-equal to ATen's sin: for ``tolerance`` kernels only. numpy's sin under the interpreter."""
        if _INTERPRET:
            return tl.sin(x)
        else:
            k = libdevice.rint(x * _INV_TWO_PI)
            r = tl.fma(k, -_TWO_PI_HI, x)
            r = tl.fma(k, -_TWO_PI_LO, r)
            return tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=f,f", [r], dtype=tl.float32, is_pure=True,
                                             pack=1)

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
