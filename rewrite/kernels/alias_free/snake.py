"""The Triton kernel of AuK's alias-free SnakeBeta (``rewrite::alias_free_snake``), beside its launcher.

`run_triton_kernel` computes `rewrite.models.auk.alias_free_reference.alias_free_snake_reference` in one pass, no
intermediate in global memory. In polyphase form, with ``h`` the taps and ``clamp`` the replicate padding
(input indices clamped into ``[0, T-1]``)::

    u(2p)     = 2 * sum_q h[2q+1] * x[clamp(p + 2 - q)]     q = 0..5
    u(2p - 1) = 2 * sum_q h[2q]   * x[clamp(p + 2 - q)]     (the same six inputs)
    y[m]      = sum_q h[2q+1] * v(2(m+q-5)) + h[2q] * v(2(m+q-5) - 1)

and the causal low-pass reads ``v(j)`` for ``j < 0`` as ``v(0)`` (its replicate pad is applied to the
SnakeBeta *output*, so it repeats ``v(0)``, not ``v`` of a clamped input). A program owns a tile of
``BLOCK_R`` rows (of ``B*C``) and ``BLOCK_T`` positions; it computes ``v(2p)`` and ``v(2p-1)`` once per
position in registers (two sines per output sample) and shifts them along the tile with ``tl.gather``; tiles
overlap by a halo of ``HALO`` positions. Math is fp32 whatever the input dtype (fp32, fp16, bf16); the output
has the input dtype.

Exactness: ``tolerance`` (launched with the tolerance flags of `rewrite.kernels.launch.launch`: FMA
contraction on). The 6-term upsample and the 12-term low-pass are summed in this kernel's order, where
cuDNN uses another; the exponentials are libdevice's ``expf``, ``1/(exp(beta)+1e-9)`` is an IEEE division,
and the sine is the hardware's ``sin.approx.f32`` after a two-constant range reduction
(`rewrite.kernels.aten_math.sin_fast`, absolute error about 2**-20.9). fp16/bf16: fp32 math on the rounded
inputs, one rounding at the end. Measured accuracy and cost: docs/tuning.md section 5, "AuK alias-free activation".

The kernel reads any x whose ``B * C`` rows are contiguous runs at one stride (`rows_stride`: a contiguous x,
or a view cropping each row such as the causal transposed conv's output) in place; other layouts are copied
first. With ``left_zeros`` it also writes a causal conv's zero pad, and with ``channels_last_out`` it writes
``[B, left + T, C]`` (TF32-rounded with ``round_tf32``): the input of `rewrite.kernels.conv1d.conv1d`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.kernels import launch as triton_launch
from rewrite.kernels import valid_length
from rewrite.kernels.alias_free.geometry import validate
from rewrite.ops.dispatch import triton

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALO = 8  # positions a Triton tile recomputes on its left (the low-pass reaches back 6: 8 keeps alignment)

if triton is not None:
    import triton.language as tl

    # libdevice's expf (what ATen's CUDA kernels call) and the hardware sine after a range reduction
    # (triton_math.sin_fast); numpy's under the interpreter
    from rewrite.kernels.aten_math import exp as _exp
    from rewrite.kernels.aten_math import round_tf32, round_to
    from rewrite.kernels.aten_math import sin_fast as _sin

    @triton.jit
    def _snake_params(alpha_ptr, beta_ptr, channel, row_mask, LOGSCALE: tl.constexpr):
        """Per-row ``exp(alpha)`` and ``1 / (exp(beta) + 1e-9)`` in fp32, shaped ``[BLOCK_R, 1]``."""
        a = tl.load(alpha_ptr + channel, mask=row_mask, other=0.0).to(tl.float32)
        b = tl.load(beta_ptr + channel, mask=row_mask, other=0.0).to(tl.float32)
        if LOGSCALE:
            a = _exp(a)
            b = _exp(b)
        inv_b = tl.math.div_rn(tl.full(b.shape, 1.0, tl.float32), b + 1e-9)
        return a[:, None], inv_b[:, None]

    @triton.jit
    def _snake(u, a, inv_b):
        """SnakeBeta ``u + inv_b * sin(u * a)**2`` (fp32)."""
        s = _sin(u * a)
        return u + inv_b * (s * s)

    @triton.jit
    def _load_input(x_row, idx, row_mask, x_bias, HAS_X_BIAS: tl.constexpr):
        """``x[clamp(idx)]`` in fp32, plus ``x_bias`` (``[BLOCK_R, 1]`` fp32), the deferred per-channel bias of
        the conv that produced x, when ``HAS_X_BIAS`` (rounded to x's dtype, as ATen's ``add_`` of that bias
        would have stored it)."""
        raw = tl.load(x_row + idx[None, :], mask=row_mask[:, None], other=0.0)
        xv = raw.to(tl.float32)
        if HAS_X_BIAS:
            xv = round_to(xv + x_bias, raw.dtype).to(tl.float32)
        return xv

    @triton.jit
    def _upsample_pair(x_row, p, T, row_mask, taps_ptr, x_bias, HAS_X_BIAS: tl.constexpr):
        """``(u(2p), u(2p-1))`` of the x2 upsampler: both read ``x[clamp(p + 2 - q)]``, q = 0..5.

        ``x_row``: ``[BLOCK_R, 1]`` row pointers; ``p``: ``[N]`` positions; result ``[BLOCK_R, N]`` fp32.
        The clamp into ``[0, T-1]`` is the replicate padding (it never reaches further than its 5 samples).
        """
        xv = _load_input(x_row, tl.minimum(tl.maximum(p + 2, 0), T - 1), row_mask, x_bias, HAS_X_BIAS)
        even = tl.load(taps_ptr + 1).to(tl.float32) * xv
        odd = tl.load(taps_ptr).to(tl.float32) * xv
        for q in tl.static_range(1, 6):
            xv = _load_input(x_row, tl.minimum(tl.maximum(p + (2 - q), 0), T - 1), row_mask, x_bias, HAS_X_BIAS)
            even += tl.load(taps_ptr + (2 * q + 1)).to(tl.float32) * xv
            odd += tl.load(taps_ptr + 2 * q).to(tl.float32) * xv
        return 2.0 * even, 2.0 * odd

    @triton.jit
    def _oversampled_snake(x_row, p, T, row_mask, taps_ptr, a, inv_b, v0, x_bias, HAS_X_BIAS: tl.constexpr):
        """``(v(2p), v(2p-1))``: SnakeBeta of the upsampled pair, with ``v(j<0) = v(0)`` (causal pad)."""
        up_even, up_odd = _upsample_pair(x_row, p, T, row_mask, taps_ptr, x_bias, HAS_X_BIAS)
        v_even = tl.where(p[None, :] < 0, v0, _snake(up_even, a, inv_b))
        v_odd = tl.where(p[None, :] <= 0, v0, _snake(up_odd, a, inv_b))
        return v_even, v_odd

    # The limit arguments (14, 15: see `rewrite.kernels.valid_length`) are not specialized: one variant for every
    # layer's scale.
    @triton.jit(do_not_specialize=[14, 15])
    def _alias_free_snake_kernel(
        x_ptr, x_bias_ptr, alpha_ptr, beta_ptr, taps_ptr, out_ptr, rows, channels, T, t_blocks, x_row_stride,
        out_row_stride, out_offset, limit_ptr, limit_scale, limit_extra,
        LOGSCALE: tl.constexpr, HAS_X_BIAS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
        HALO_T: tl.constexpr, ZEROS_BLOCK: tl.constexpr, OUT_CHANNELS_LAST: tl.constexpr = False,
        ROUND_TF32: tl.constexpr = False,
    ):
        """One ``[BLOCK_R, BLOCK_T - HALO_T]`` output tile: positions ``base + i`` with ``i >= HALO_T``.

        Input row ``r`` (of ``B * C``) starts at ``r * x_row_stride``: a contiguous x, or a view that crops
        each row (the causal transposed conv's output). Output row ``r`` starts at ``r * out_row_stride``
        and holds ``out_offset`` zeros (a causal conv's zero pad; the programs of time block 0 write them,
        ``ZEROS_BLOCK`` >= out_offset, 0 for none) then the ``T`` outputs. With ``OUT_CHANNELS_LAST`` the
        output is ``[B, out_offset + T, C]`` instead (position-major, what the Triton conv reads;
        ``out_row_stride`` unused) and the launcher guarantees ``channels % BLOCK_R == 0``, so a row block
        is ``BLOCK_R`` adjacent channels of one batch row: contiguous along the block for the stores.
        ``ROUND_TF32`` (fp32 only) stores the outputs rounded to TF32 (for a TF32 conv that reads them).

        A 1-D grid (no 65535 limit on any axis): program ``pid`` is row block ``pid // t_blocks``, time
        block ``pid % t_blocks`` (neighbouring programs share input rows). With ``limit_scale > 0`` a time
        block whose first output lies at or past ``limit_ptr[0] * limit_scale + limit_extra`` returns at once
        (`rewrite.kernels.valid_length`; block 0, which writes the zeros, never does).
        """
        pid = tl.program_id(0)
        if limit_scale > 0:
            if (pid % t_blocks) * (BLOCK_T - HALO_T) >= tl.load(limit_ptr) * limit_scale + limit_extra:
                return
        r = (pid // t_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
        row_mask = r < rows
        channel = r % channels
        a, inv_b = _snake_params(alpha_ptr, beta_ptr, channel, row_mask, LOGSCALE)
        x_bias = tl.zeros([BLOCK_R, 1], tl.float32)
        if HAS_X_BIAS:
            x_bias = tl.load(x_bias_ptr + channel, mask=row_mask, other=0.0).to(tl.float32)[:, None]
        x_row = x_ptr + r.to(tl.int64)[:, None] * x_row_stride
        zero = tl.zeros([1], tl.int32)
        v0 = _snake(_upsample_pair(x_row, zero, T, row_mask, taps_ptr, x_bias, HAS_X_BIAS)[0], a, inv_b)

        i = tl.arange(0, BLOCK_T)
        t_block = pid % t_blocks
        p = t_block * (BLOCK_T - HALO_T) - HALO_T + i
        v_even, v_odd = _oversampled_snake(x_row, p, T, row_mask, taps_ptr, a, inv_b, v0, x_bias, HAS_X_BIAS)

        acc = tl.zeros([BLOCK_R, BLOCK_T], tl.float32)
        for q in tl.static_range(6):  # y[m] = sum_q h[2q+1] v(2(m+q-5)) + h[2q] v(2(m+q-5) - 1)
            shift = tl.broadcast_to(tl.maximum(i + (q - 5), 0)[None, :], (BLOCK_R, BLOCK_T))
            acc += tl.load(taps_ptr + (2 * q + 1)).to(tl.float32) * tl.gather(v_even, shift, 1)
            acc += tl.load(taps_ptr + 2 * q).to(tl.float32) * tl.gather(v_odd, shift, 1)

        mask = row_mask[:, None] & ((i >= HALO_T) & (p < T))[None, :]
        if ROUND_TF32:
            acc = round_tf32(acc)
        if OUT_CHANNELS_LAST:
            row0 = (pid // t_blocks) * BLOCK_R
            batch = row0 // channels
            out_row = (out_ptr + batch.to(tl.int64) * (out_offset + T) * channels
                       + (row0 - batch * channels + tl.arange(0, BLOCK_R))[:, None])
            position_stride = channels
        else:
            out_row = out_ptr + r.to(tl.int64)[:, None] * out_row_stride
            position_stride = 1
        positions = (out_offset + p).to(tl.int64)  # times C when channels-last: past 2**31 on long clips
        tl.store(out_row + positions[None, :] * position_stride, acc.to(out_ptr.dtype.element_ty), mask=mask)
        if ZEROS_BLOCK > 0:
            if t_block == 0:
                j = tl.arange(0, ZEROS_BLOCK)
                zeros = tl.zeros([BLOCK_R, ZEROS_BLOCK], out_ptr.dtype.element_ty)
                tl.store(out_row + j[None, :] * position_stride, zeros,
                         mask=row_mask[:, None] & (j < out_offset)[None, :])


class SnakeTile(NamedTuple):
    """A program's tile: `rows` of ``B * C`` by `positions` (outputs plus the halo), on `warps` warps."""

    rows: int
    positions: int
    warps: int


# Launch geometry (H200 measurements: docs/tuning.md section 5, "AuK alias-free activation"): one warp per program
# and tiles of at most 256 positions keep every tl.gather inside one warp (shuffles, no shared-memory round trip).
TILE_ELEMENTS = 256  # positions (outputs plus halo) x rows per program
BLOCK_T_CHOICES = (16, 32, 64, 128, 256)
TILE_OVERHEAD = 64  # per-tile cost, in positions, when choosing BLOCK_T
NUM_WARPS = 1
# The zero margin block: one size for every AuK pad (at most 5 * (11 - 1) = 50), so the pads do not each
# compile a kernel variant of their own (the price: masked lanes in the zero stores of time block 0 only).
MIN_ZEROS_BLOCK = 64


def _launch_config(rows: int, length: int) -> SnakeTile:
    """The least padded work (a tile costs its size plus an overhead), ties to the larger tile; rows fill the
    tile up to `TILE_ELEMENTS`."""

    def cost(block_t: int) -> tuple[int, int]:
        tiles = triton.cdiv(length, block_t - HALO)
        return tiles * (block_t + TILE_OVERHEAD), -block_t

    block_t = min(BLOCK_T_CHOICES, key=cost)
    block_r = min(triton.next_power_of_2(rows), max(1, TILE_ELEMENTS // block_t))
    return SnakeTile(block_r, block_t, NUM_WARPS)


# Channels-last output (the Triton conv's input): a row block must be adjacent channels of one batch row.
CHANNELS_LAST_WIDE = SnakeTile(rows=8, positions=128, warps=4)  # C >= 48
CHANNELS_LAST_NARROW = SnakeTile(rows=4, positions=64, warps=1)  # rows: at most C's power-of-two factor


def _launch_config_channels_last(channels: int) -> SnakeTile:
    """The tile for a channels-last output; its rows always divide `channels`."""
    if channels >= 48 and channels % CHANNELS_LAST_WIDE.rows == 0:
        return CHANNELS_LAST_WIDE
    return CHANNELS_LAST_NARROW._replace(rows=min(CHANNELS_LAST_NARROW.rows, channels & -channels))


def rows_stride(x: Tensor) -> Optional[int]:
    """The one stride between the ``B * C`` rows of a ``[B, C, T]`` x whose rows are contiguous runs (a
    contiguous x, or a view cropping each row, such as the causal transposed conv's output), else None."""
    batch, channels, length = x.shape
    if length > 1 and x.stride(2) != 1:
        return None
    if batch > 1 and channels > 1 and x.stride(0) != channels * x.stride(1):
        return None
    return x.stride(1) if channels > 1 else x.stride(0) if batch > 1 else length


def run_triton_kernel(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor, logscale: bool = True,
                      left_zeros: int = 0, x_bias: Optional[Tensor] = None, channels_last_out: bool = False,
                      round_tf32: bool = False, launch: Optional[SnakeTile] = None) -> Tensor:
    """Launch the fused kernel (no dispatch checks beyond the preconditions it relies on).

    ``x``: ``[B, C, T]`` fp32/fp16/bf16 on CUDA (or CPU under ``TRITON_INTERPRET=1``) whose rows are
    contiguous (`rows_stride`; other layouts are copied first); alpha, beta, taps as for
    `alias_free_snake`. ``x_bias`` (``[C]``, x's dtype): the bias of the conv that produced x, deferred
    to here: the kernel reads ``x + x_bias`` rounded to x's dtype, what ``x.add_(x_bias)`` would hold.
    Returns a new contiguous tensor of x's dtype, ``[B, C, left_zeros + T]`` with zeros in its first
    ``left_zeros`` columns (a causal conv's zero pad, written by the kernel so that no pad pass copies the
    activation again). With ``channels_last_out`` the result is ``[B, left_zeros + T, C]`` (contiguous,
    position-major: the input layout of `rewrite.kernels.conv1d.conv1d`) with the zeros in its first
    ``left_zeros`` positions. ``round_tf32`` (fp32 only) stores the outputs rounded to the nearest TF32
    value, for a TF32 conv that reads them (its tensor cores would truncate them). ``launch`` overrides the
    tile (rows, positions, warps; probes).
    """
    if triton is None:
        raise RuntimeError("alias_free_snake: triton is not importable")
    validate(x, alpha, beta, taps)
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"alias_free_snake: the kernel needs a {SUPPORTED_DTYPES} x, got {x.dtype}")
    if x_bias is not None and (x_bias.numel() != x.shape[1] or x_bias.dtype != x.dtype or x_bias.device != x.device):
        raise ValueError(f"alias_free_snake: x_bias must hold C={x.shape[1]} values of x's dtype and device, "
                         f"got {tuple(x_bias.shape)} {x_bias.dtype} on {x_bias.device}")
    if round_tf32 and x.dtype != torch.float32:
        raise ValueError(f"alias_free_snake: round_tf32 needs an fp32 x, got {x.dtype}")
    row_stride = rows_stride(x)
    if row_stride is None:
        x = x.contiguous()
        row_stride = x.shape[2]
    batch, channels, length = x.shape
    shape = (batch, left_zeros + length, channels) if channels_last_out else (batch, channels, left_zeros + length)
    out = x.new_empty(shape)
    rows = batch * channels
    if rows == 0:
        return out
    if launch is not None:
        block_r, block_t, num_warps = launch
    elif channels_last_out:
        block_r, block_t, num_warps = _launch_config_channels_last(channels)
    else:
        block_r, block_t, num_warps = _launch_config(rows, length)
    if channels_last_out and channels % block_r:
        raise ValueError(f"alias_free_snake: a channels-last output needs BLOCK_R={block_r} to divide C={channels}")
    t_blocks = triton.cdiv(length, block_t - HALO)
    grid = (triton.cdiv(rows, block_r) * t_blocks,)
    triton_launch.launch(
        _alias_free_snake_kernel, grid,
        x, x if x_bias is None else x_bias.reshape(-1).contiguous(), alpha.reshape(-1).contiguous(),
        beta.reshape(-1).contiguous(), taps.reshape(-1).contiguous(), out,
        rows, channels, length, t_blocks, row_stride, left_zeros + length, left_zeros,
        *valid_length.kernel_args(length, x.device),
        LOGSCALE=logscale, HAS_X_BIAS=x_bias is not None, BLOCK_R=block_r, BLOCK_T=block_t, HALO_T=HALO,
        ZEROS_BLOCK=max(MIN_ZEROS_BLOCK, triton.next_power_of_2(left_zeros)) if left_zeros else 0,
        OUT_CHANNELS_LAST=channels_last_out,
        ROUND_TF32=round_tf32, num_warps=num_warps, exact=False,
    )
    return out
