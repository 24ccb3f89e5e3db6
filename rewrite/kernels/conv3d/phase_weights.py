"""The four output phases' 2x2 kernels of a 3x3 conv (pad 1) of a 2x nearest upsample, in one Triton pass.

Output pixel ``(2h + ph, 2w + pw)`` of ``conv2d(upsample_nearest2x(x), weight, padding=1)`` reads source rows
``h + ph - 1 + j`` and columns ``w + pw - 1 + k`` (j, k in 0, 1); each of its 2x2 taps sums the 3x3 taps that
land on that source pixel (rows {0}, {1, 2} for ph 0 and {0, 1}, {2} for ph 1; columns alike). `phase_weights`
returns them as ``[4, O, C, 2, 2]`` (phase ``2 * ph + pw``) in ``[4, O, 2, 2, C]`` memory, so that phase p's
``[O, C, 2, 2]`` is channels-last (the Triton phase convs' operand, `triton_conv3d.upsample2x_conv2d_channels_last`)
and the whole, viewed ``[4 * O, C, 2, 2]``, is too (`wan_upsample_fast.phase_conv`'s cuDNN conv).

`phase_weights_reference` is the same arithmetic in ATen ops (about twenty small kernels per call, run on every
upsampler call inside the decode's CUDA graphs); the kernel reads each weight once and writes the result in
one launch. Exactness: exact against `phase_weights_reference`: the same fp32 sums in the same order (the rows
of a group first, then the columns of those sums), one rounding to the weight's dtype (`torch.equal`,
tests/models/wan/test_upsample_fast.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rewrite.ops.dispatch import INTERPRETING, triton
from rewrite.kernels.launch import launch

__all__ = ["phase_weights", "phase_weights_reference"]

BLOCK = 256  # (o, c) pairs per program


def phase_weights_reference(weight: Tensor) -> Tensor:
    """`phase_weights` in ATen ops: [4, O, C, 2, 2], summed in fp32 and rounded once to the weight's dtype."""
    w = weight.float()

    def halves(t: Tensor, dim: int, phase: int) -> Tensor:
        first, middle, last = t.unbind(dim)
        pair = (first, middle + last) if phase == 0 else (first + middle, last)
        return torch.stack(pair, dim)

    rows = [halves(w, 2, ph) for ph in (0, 1)]
    return torch.stack([halves(r, 3, pw) for r in rows for pw in (0, 1)]).to(weight.dtype)


if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import round_to as _round

    @triton.jit
    def _halves(first, middle, last, PHASE: tl.constexpr):
        """A 3-tap line folded onto 2 source pixels: (first, middle + last) for phase 0, else (first + middle, last)."""
        if PHASE == 0:
            return first, middle + last
        else:
            return first + middle, last

    @triton.jit
    def _store_phase(out_ptr, o, c, O, C, mask, w00, w01, w02, w10, w11, w12, w20, w21, w22, PH: tl.constexpr,
                     PW: tl.constexpr):
        """Phase (PH, PW)'s 2x2 taps of the fp32 3x3 taps w<row><column>, rounded, into [4, O, 2, 2, C] memory."""
        r00, r10 = _halves(w00, w10, w20, PH)  # the rows folded, per column
        r01, r11 = _halves(w01, w11, w21, PH)
        r02, r12 = _halves(w02, w12, w22, PH)
        t00, t01 = _halves(r00, r01, r02, PW)  # then the columns of those sums
        t10, t11 = _halves(r10, r11, r12, PW)
        base = out_ptr + ((2 * PH + PW) * O + o).to(tl.int64) * 4 * C + c
        dtype = out_ptr.dtype.element_ty
        tl.store(base, _round(t00, dtype), mask=mask)
        tl.store(base + C, _round(t01, dtype), mask=mask)
        tl.store(base + 2 * C, _round(t10, dtype), mask=mask)
        tl.store(base + 3 * C, _round(t11, dtype), mask=mask)

    @triton.jit
    def _phase_weights_kernel(w_ptr, out_ptr, O, C, s_o, s_c, s_h, s_w, BLOCK: tl.constexpr):
        """BLOCK (o, c) pairs (c fastest) per program: their 9 taps read once, the 16 phase taps written."""
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < O * C
        o = i // C
        c = i % C
        src = w_ptr + o.to(tl.int64) * s_o + c.to(tl.int64) * s_c
        w00 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        w01 = tl.load(src + s_w, mask=mask, other=0.0).to(tl.float32)
        w02 = tl.load(src + 2 * s_w, mask=mask, other=0.0).to(tl.float32)
        w10 = tl.load(src + s_h, mask=mask, other=0.0).to(tl.float32)
        w11 = tl.load(src + s_h + s_w, mask=mask, other=0.0).to(tl.float32)
        w12 = tl.load(src + s_h + 2 * s_w, mask=mask, other=0.0).to(tl.float32)
        w20 = tl.load(src + 2 * s_h, mask=mask, other=0.0).to(tl.float32)
        w21 = tl.load(src + 2 * s_h + s_w, mask=mask, other=0.0).to(tl.float32)
        w22 = tl.load(src + 2 * s_h + 2 * s_w, mask=mask, other=0.0).to(tl.float32)
        _store_phase(out_ptr, o, c, O, C, mask, w00, w01, w02, w10, w11, w12, w20, w21, w22, 0, 0)
        _store_phase(out_ptr, o, c, O, C, mask, w00, w01, w02, w10, w11, w12, w20, w21, w22, 0, 1)
        _store_phase(out_ptr, o, c, O, C, mask, w00, w01, w02, w10, w11, w12, w20, w21, w22, 1, 0)
        _store_phase(out_ptr, o, c, O, C, mask, w00, w01, w02, w10, w11, w12, w20, w21, w22, 1, 1)


def phase_weights(weight: Tensor) -> Tensor:
    """The [4, O, C, 2, 2] phase kernels of a [O, C, 3, 3] weight (module docstring), in [4, O, 2, 2, C] memory:
    one Triton pass on CUDA (or under the interpreter), else `phase_weights_reference` copied into that memory."""
    if weight.dim() != 4 or tuple(weight.shape[2:]) != (3, 3):
        raise ValueError(f"phase_weights: expected a [O, C, 3, 3] weight, got {tuple(weight.shape)}")
    o, c = weight.shape[:2]
    out = torch.empty((4, o, 2, 2, c), dtype=weight.dtype, device=weight.device).permute(0, 1, 4, 2, 3)
    if triton is None or not (weight.is_cuda or INTERPRETING) or weight.dtype == torch.float64:
        return out.copy_(phase_weights_reference(weight))
    if out.numel():
        launch(_phase_weights_kernel, (triton.cdiv(o * c, BLOCK),), weight, out, o, c, *weight.stride(), BLOCK=BLOCK)
    return out
