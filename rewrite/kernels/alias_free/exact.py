"""Triton kernels behind ``rewrite::alias_free_snake_exact``, bit-identical to the ATen ops they replace.

The exact alias-free SnakeBeta (`rewrite.models.auk.ops`) keeps ATen's two depthwise convolutions (cuDNN sums the
12 taps in an order no kernel here could reproduce) and replaces the data movement and the elementwise
chain around them:

- `replicate_pad1d(x, left, right)`: ``F.pad(x, (left, right), mode="replicate")`` of a contiguous
  ``[B, C, T]`` tensor, ``out[..., j] = x[..., clamp(j - left, 0, T - 1)]``. Pure data movement: the bits
  of ``x`` are copied, so it is exact on every device, in every dtype, also under the interpreter.
- `snake_exact(up, a, inv_b, ratio, crop, left)`: from the full (uncropped) transposed-conv output ``up``
  ``[B, C, L]`` and the per-channel ``a = exp(alpha)``, ``inv_b = 1 / (exp(beta) + 1e-9)`` (computed by
  the caller with the reference's own ATen calls), the SnakeBeta output already replicate-padded on the
  left, ``[B, C, L - 2 * crop + left]``::

      u = up * ratio                      (ATen: aten.mul.Tensor(up, 2), then the [crop:-crop] slice)
      v = u + inv_b * sin(u * a) ** 2     (mul, sin, pow(., 2), mul, add: five ATen kernels)
      out[..., j] = v[..., max(j - left, 0)]

  Every one of those six ATen results is materialized by ATen in the activation dtype, so the kernel
  rounds to that dtype after each of them, in ATen's order, and computes each in fp32 ("opmath") from
  the rounded operands (fp32 inputs: the roundings are no-ops):

  ============================  ===========================================================  ===========
  ATen op (CUDA kernel)          what ATen computes for fp16/bf16 (fp32: the same in fp32)    here
  ============================  ===========================================================  ===========
  ``mul.Tensor(up, 2)``          ``MulFunctor<float>``: ``float(up) * 2.0f``, rounded RN      same
                                 (the Python scalar becomes a CPU-scalar operand cast to float)
  ``mul.Tensor(u, a)``           ``float(u) * float(a)``, rounded RN                          same
  ``sin``                        ``::sin(a)`` on the dtype value: ``sinf(float(a))``, RN      libdevice
  ``pow.Tensor_Scalar(s, 2)``    ``base * base`` on the dtype (PowKernel.cu, ``d_exp == 2``):  same
                                 c10's Half/BFloat16 ``operator*`` is ``float * float``, RN
  ``mul.Tensor(inv_b, sq)``      ``float(inv_b) * float(sq)``, rounded RN                     same
  ``add.Tensor(u, w)``           ``float(u) + 1.0f * float(w)``, rounded RN (alpha 1: exact)   same
  ============================  ===========================================================  ===========

  ``sinf`` is libdevice's ``__nv_sinf``, which is what nvcc links for ``::sin(float)``; it runs with
  libdevice's flush-to-zero reflection off (``enable_reflect_ftz=False``, nvcc's default, which PyTorch
  builds with), and every launch has ``enable_fp_fusion=False`` so ``u + inv_b * sq`` (fp32) is never
  contracted into an FMA (both flags are `rewrite.kernels.launch.launch`'s for exact kernels). Rounding fp32 to fp16/bf16 is round-to-nearest-even, as ``__float2half`` /
  ``__float2bfloat16`` (`rewrite.kernels.aten_math.round_to`).

Exactness: exact: bit-identical on CUDA for fp32, fp16 and bf16 (``torch.equal`` with the reference, NaN
payloads aside), by the construction above; the ``gpu`` tests of tests/kernels/alias_free/test_exact.py check it on
the full-size AuK shapes, random shapes and extreme magnitudes. Under the CPU interpreter ``sin`` is numpy's float32 ``sin``, which differs from ATen's CPU ``sin``
by an ulp on some inputs; every other step is still exact there (tests/kernels/alias_free/test_exact.py checks it
against the reference with numpy's sine swapped in).

Preconditions (the caller, `rewrite.models.auk.ops`, checks them; the functions raise ValueError otherwise):
contiguous ``[B, C, T]`` tensors on one device (CUDA, or CPU under ``TRITON_INTERPRET=1``), fp32/fp16/bf16;
``a``/``inv_b`` hold one value per channel in ``up``'s dtype; ``T >= 1`` for the pad, ``L > 2 * crop`` for
SnakeBeta.

Launch geometry: one program per (row, block of 256-2048 columns, chosen per row length to waste the least),
on a 1-D grid (the row and block come from one scalar division per program, none per element), 8 columns
per thread from 256-column blocks on; rows are contiguous, so loads and stores coalesce. Row lengths
(``2T + 30``, ``2T + 11``) are rarely multiples of 16 bytes, so accesses are per element; the clamped source
index costs nothing more. Not tuned on a GPU yet.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rewrite.ops.dispatch import triton
from rewrite.kernels.launch import launch

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_CHOICES = (256, 512, 1024, 2048)  # columns per program
BLOCK_OVERHEAD = 128  # per-program cost, in columns, when choosing among them
MIN_BLOCK = 16

if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import round_to as _round
    from rewrite.kernels.aten_math import sin as _sin

    @triton.jit
    def _replicate_pad_kernel(x_ptr, out_ptr, T, T_OUT, LEFT, col_blocks, BLOCK: tl.constexpr):
        """``out[row, j] = x[row, clamp(j - LEFT, 0, T - 1)]`` for one row and BLOCK columns."""
        pid = tl.program_id(0)
        row = (pid // col_blocks).to(tl.int64)
        j = (pid % col_blocks) * BLOCK + tl.arange(0, BLOCK)
        mask = j < T_OUT
        src = tl.minimum(tl.maximum(j - LEFT, 0), T - 1)
        value = tl.load(x_ptr + row * T + src, mask=mask)
        tl.store(out_ptr + row * T_OUT + j, value, mask=mask)

    @triton.jit
    def _snake(up, a, inv_b, RATIO: tl.constexpr):
        """``u + inv_b * sin(u * a)**2`` with ``u = up * RATIO``, rounded to ``up``'s dtype after every op."""
        dtype = up.dtype
        u = _round(up.to(tl.float32) * RATIO, dtype).to(tl.float32)        # mul.Tensor(up, RATIO)
        t = _round(u * a, dtype).to(tl.float32)                             # mul.Tensor(u, a)
        s = _round(_sin(t), dtype).to(tl.float32)                           # sin
        sq = _round(s * s, dtype).to(tl.float32)                            # pow.Tensor_Scalar(s, 2)
        w = _round(inv_b * sq, dtype).to(tl.float32)                        # mul.Tensor(inv_b, sq)
        return _round(u + w, dtype)                                         # add.Tensor(u, w)

    @triton.jit
    def _snake_exact_kernel(up_ptr, a_ptr, inv_b_ptr, out_ptr, C, L_UP, L_OUT, col_blocks,
                            RATIO: tl.constexpr, CROP: tl.constexpr, LEFT: tl.constexpr, BLOCK: tl.constexpr):
        """One row, BLOCK output columns: ``out[j] = snake(up[max(j - LEFT, 0) + CROP])``.

        The padding columns (``j < LEFT``) compute ``v(0)`` in the same vector as every other column, so
        they hold the very bits of column ``LEFT`` (as ATen's replicate pad copies them).
        """
        pid = tl.program_id(0)
        row = pid // col_blocks
        j = (pid % col_blocks) * BLOCK + tl.arange(0, BLOCK)
        mask = j < L_OUT
        channel = row % C
        a = tl.load(a_ptr + channel).to(tl.float32)
        inv_b = tl.load(inv_b_ptr + channel).to(tl.float32)
        up = tl.load(up_ptr + row.to(tl.int64) * L_UP + (tl.maximum(j, LEFT) + (CROP - LEFT)), mask=mask, other=0.0)
        tl.store(out_ptr + row.to(tl.int64) * L_OUT + j, _snake(up, a, inv_b, RATIO), mask=mask)


def _block(length: int) -> int:
    """Columns per program: the least padded work (each program costs its block plus an overhead), ties to
    the larger block; a short row gets one block of the next power of two."""
    if length <= BLOCK_CHOICES[0]:
        return max(MIN_BLOCK, triton.next_power_of_2(length))
    return min(BLOCK_CHOICES, key=lambda block: (triton.cdiv(length, block) * (block + BLOCK_OVERHEAD), -block))


def _launch(kernel, rows: int, length: int, *args, **constexprs) -> None:
    """1-D grid over (row, column block) for rows of `length` output columns; one warp per 256 columns."""
    if rows == 0 or length == 0:
        return
    block = _block(length)
    col_blocks = triton.cdiv(length, block)
    num_warps = max(1, block // 256)
    launch(kernel, (rows * col_blocks,), *args, col_blocks, BLOCK=block, num_warps=num_warps, **constexprs)


def _check(t: Tensor, name: str) -> None:
    if triton is None:
        raise RuntimeError("triton_auk: triton is not importable")
    if t.dim() != 3 or not t.is_contiguous() or t.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"triton_auk: {name} must be a contiguous [B, C, T] tensor of {SUPPORTED_DTYPES}, "
                         f"got {tuple(t.shape)} {t.dtype} strides {t.stride()}")


def replicate_pad1d(x: Tensor, left: int, right: int) -> Tensor:
    """``F.pad(x, (left, right), mode="replicate")`` for a contiguous ``[B, C, T]`` x, ``T >= 1``."""
    _check(x, "x")
    batch, channels, length = x.shape
    if length < 1 or left < 0 or right < 0:
        raise ValueError(f"triton_auk.replicate_pad1d: needs T >= 1 and pads >= 0, got T={length} ({left}, {right})")
    out = x.new_empty((batch, channels, length + left + right))
    _launch(_replicate_pad_kernel, batch * channels, out.shape[-1], x, out, length, out.shape[-1], left)
    return out


def snake_exact(up: Tensor, a: Tensor, inv_b: Tensor, ratio: int, crop: int, left: int) -> Tensor:
    """SnakeBeta of ``(up * ratio)[..., crop:-crop]``, replicate-padded by ``left`` on the left (module docstring).

    ``up``: contiguous ``[B, C, L]``; ``a``, ``inv_b``: ``C`` values each in ``up``'s dtype (any shape,
    e.g. the reference's ``[1, C, 1]``). Returns a contiguous ``[B, C, L - 2 * crop + left]``.
    """
    _check(up, "up")
    batch, channels, length = up.shape
    if length <= 2 * crop or crop < 0 or left < 0:
        raise ValueError(f"triton_auk.snake_exact: needs L > 2 * crop >= 0 and left >= 0, "
                         f"got L={length}, crop={crop}, left={left}")
    a, inv_b = a.reshape(-1).contiguous(), inv_b.reshape(-1).contiguous()
    for name, t in (("a", a), ("inv_b", inv_b)):
        if t.numel() != channels or t.dtype != up.dtype or t.device != up.device:
            raise ValueError(f"triton_auk.snake_exact: {name} must hold C={channels} values of {up.dtype} on "
                             f"{up.device}, got {t.numel()} of {t.dtype} on {t.device}")
    out = up.new_empty((batch, channels, length - 2 * crop + left))
    _launch(_snake_exact_kernel, batch * channels, out.shape[-1], up, a, inv_b, out, channels, length,
            out.shape[-1], RATIO=float(ratio), CROP=crop, LEFT=left)
    return out
