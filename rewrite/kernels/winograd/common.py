"""What both Winograd forms share: the launch tile, the argument checks, the refusals, the per-card choice and
the epilogue's store (`rewrite.kernels.winograd.winograd` says what the kernels compute)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.kernels import cards
from rewrite.kernels.winograd.transforms import POINTS
from rewrite.ops.dispatch import INTERPRETING, triton

GPU_DTYPES = (torch.bfloat16, torch.float16)


class WinogradTile(NamedTuple):
    """A launch configuration: `block_m` 2x2 output blocks by `block_n` output channels per program, `block_k`
    input channels per GEMM step, `warps`, pipeline `stages`, and which form runs it."""

    block_m: int = 32
    block_n: int = 64
    block_k: int = 32
    warps: int = 4
    stages: int = 2
    materialized: bool = False  # the input transform written to memory first (`materialized`)
    transform_frames: int = 0  # materialized: output frames per input transform, one batch element (0: all at once)
    one_loop: bool = False  # materialized: the 16 point GEMMs as one pipelined loop (else a loop per point)
    split_output: bool = False  # materialized: a program per point GEMM writing fp32 sums, then the output transform
    output_block: int = 2  # 2: F(2x2, 3x3); 4: F(4x4, 3x3) (`large_tile`: the split form, fp16 operands)


#: card -> {(in channels, out channels, output width, dtype): tile}, for the convs this kernel measured faster than
#: both the Triton direct conv and cuDNN on that card, in a full decode within the level's contract. Widths are
#: exact: another size's plane was not measured and keeps its conv. The H100's Wan 2.2 levels by F(4x4, 3x3), with
#: the weight transformed in each call: the three 720p levels of docs/tuning.md 1.25 (1024 -> 1024 at 90x160 2.07x
#: cuDNN, 512 -> 512 at 180x320 1.89x, 256 -> 256 at 360x640 1.24x; `sweeps/winograd_large_tile_wan22_h100_bf16.json`)
#: and, from `sweeps/winograd_large_tile_widths_h100_bf16.json` (1.17-2.03x the faster of cuDNN and the direct conv,
#: the transform's time added), 720p's channel-halving convs and the 480p planes: with all ten the decodes were 2.66x
#: `off` at 720x1280x81 and 2.30x at 480x832x81, within the contract, peaks under `off`'s (tuning.md 1.27).
_LARGE_128 = WinogradTile(128, 128, 64, 8, 3, True, 0, False, True, 4)
_LARGE_256 = WinogradTile(128, 256, 64, 8, 3, True, 0, False, True, 4)
_MEASURED_FASTER: dict[str, dict[tuple[int, int, int, torch.dtype], WinogradTile]] = {
    "NVIDIA H100 80GB HBM3": {
        (1024, 1024, 160, torch.bfloat16): _LARGE_256, (512, 512, 320, torch.bfloat16): _LARGE_256,
        (256, 256, 640, torch.bfloat16): _LARGE_128, (1024, 512, 320, torch.bfloat16): _LARGE_256,
        (512, 256, 640, torch.bfloat16): _LARGE_256, (1024, 1024, 104, torch.bfloat16): _LARGE_256,
        (512, 512, 208, torch.bfloat16): _LARGE_256, (1024, 512, 208, torch.bfloat16): _LARGE_256,
        (256, 256, 416, torch.bfloat16): _LARGE_128, (512, 256, 416, torch.bfloat16): _LARGE_256,
        # Wan 2.1's 192- and 384-channel levels (`sweeps/winograd_large_tile_wan21_h100_bf16.json`: 1.06-1.58x the
        # faster of cuDNN and the direct conv; 192 -> 192 at 960 wide against cuDNN, which the H100 keeps there:
        # `conv3d.CARD_CUDNN_FASTER`). With them its decodes were 3.49x `off` at 720x1280x81 (3.36x without, same
        # run), 3.47x at 1088x1920x81 (3.35x), within the contract, peaks under `off`'s (docs/tuning.md 1.29).
        (192, 192, 960, torch.bfloat16): _LARGE_256, (192, 192, 640, torch.bfloat16): _LARGE_256,
        (384, 384, 320, torch.bfloat16): _LARGE_128, (192, 384, 320, torch.bfloat16): _LARGE_128,
        (384, 384, 480, torch.bfloat16): _LARGE_128, (384, 384, 240, torch.bfloat16): _LARGE_128,
        (192, 384, 480, torch.bfloat16): _LARGE_128, (192, 192, 416, torch.bfloat16): _LARGE_256,
        (384, 384, 208, torch.bfloat16): _LARGE_128,
    },
}

#: The same keys for convs whose kernel sweep (`python -m rewrite.tools.sweep_winograd`) found this kernel faster
#: but whose decode has not shown all the table asks, so not routed. The H100's 1024 -> 1024 at 45x80 (720p's middle
#: block and first up level): 0.211 ms against cuDNN's 0.291 with the weight kept, but its per-call transform takes
#: 0.30 ms (docs/tuning.md 1.27).
UNMEASURED_CANDIDATES: dict[str, dict[tuple[int, int, int, torch.dtype], WinogradTile]] = {
    "NVIDIA H100 80GB HBM3": {
        (1024, 1024, 80, torch.bfloat16): _LARGE_256,
    },
}


def chosen(in_channels: int, out_channels: int, width, dtype: torch.dtype,
           device: torch.device) -> Optional[WinogradTile]:
    """The tile with which this kernel serves a conv (channels, the output's width, dtype) on `device`'s card, or
    None (the direct conv or cuDNN). A width that is not a plain int (a symbolic graph's, as a pattern's guard
    sees it) cannot be looked up: any tile of the card's entries for these channels and dtype is returned, and the
    op decides at run time on its tensors' width (as `conv3d.chosen` does)."""
    card = cards.name(device)
    entries = _MEASURED_FASTER.get(card, {}) if card is not None else {}
    if not isinstance(width, int):
        return next((tile for (i, o, _, d), tile in entries.items() if (i, o, d) == (in_channels, out_channels, dtype)),
                    None)
    return entries.get((in_channels, out_channels, width, dtype))


def unsupported_reason(in_shape, weight_shape, dtype: torch.dtype) -> Optional[str]:
    """None when the kernel serves a padded input of `in_shape` ([B, C, Tp, Hp, Wp]) and a conv weight of
    `weight_shape` ([O, C, kt, 3, 3]) in `dtype`, else why not."""
    if triton is None:
        return "triton is not importable"
    if len(in_shape) != 5 or len(weight_shape) != 5 or in_shape[1] != weight_shape[1]:
        return f"expected [B, C, T, H, W] and [O, C, kt, kh, kw], got {tuple(in_shape)} and {tuple(weight_shape)}"
    if tuple(weight_shape[3:]) != (3, 3):
        return f"a {tuple(weight_shape[2:])} kernel (Winograd F(2x2, 3x3) serves 3x3 planes)"
    if dtype not in GPU_DTYPES and not (INTERPRETING and dtype == torch.float32):
        return f"dtype {dtype} (served: {GPU_DTYPES}; fp32 only under the Triton interpreter)"
    if any(s < k for s, k in zip(in_shape[2:], weight_shape[2:])):
        return f"input {tuple(in_shape[2:])} is smaller than the kernel {tuple(weight_shape[2:])}"
    return None


def checked_shape(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                  out: Tensor) -> tuple[int, ...]:
    """The output shape [B, O, T, H, W] after the argument checks both F(2x2, 3x3) forms share
    (`winograd.winograd_conv3d_channels_last` states them)."""
    channels = padded.shape[1] if padded.dim() == 5 else None
    if weight.dim() != 3 or weight.shape[0] != POINTS or not channels or weight.shape[1] % channels \
            or not weight.is_contiguous():
        raise ValueError(f"winograd conv3d: weight must be transformed_weight's contiguous "
                         f"[{POINTS}, kt * {channels}, O], got {tuple(weight.shape)} for an input "
                         f"{tuple(padded.shape)}")
    if weight.dtype != padded.dtype:
        raise ValueError(f"winograd conv3d: weight dtype {weight.dtype}, input {padded.dtype}")
    return checked_geometry(padded, weight.shape[1] // channels, weight.shape[2], bias, residual, out)


def checked_geometry(padded: Tensor, taps: int, out_channels: int, bias: Optional[Tensor], residual: Optional[Tensor],
                     out: Tensor) -> tuple[int, ...]:
    """The output shape [B, O, T, H, W] of a conv with `taps` temporal taps, 3x3 planes and `out_channels`, after
    the checks of the input, output, bias and residual every Winograd form shares."""
    if padded.dim() != 5 or not padded.is_contiguous(memory_format=torch.channels_last_3d):
        raise ValueError(f"winograd conv3d: padded input must be [B, C, T, H, W] in channels-last "
                         f"(NDHWC) contiguous memory, got {tuple(padded.shape)} strides {padded.stride()}")
    batch, channels, tp, hp, wp = padded.shape
    reason = unsupported_reason(padded.shape, (out_channels, channels, taps, 3, 3), padded.dtype)
    if reason is not None:
        raise ValueError(f"winograd conv3d: {reason}")
    shape = (batch, out_channels, tp - taps + 1, hp - 2, wp - 2)
    if tuple(out.shape) != shape or out.dtype != padded.dtype:
        raise ValueError(f"winograd conv3d: out must be {shape} {padded.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    if bias is not None and tuple(bias.shape) != (out_channels,):
        raise ValueError(f"winograd conv3d: bias must be [{out_channels}], got {tuple(bias.shape)}")
    if residual is not None and tuple(residual.shape) != shape:
        raise ValueError(f"winograd conv3d: residual must be {shape}, got {tuple(residual.shape)}")
    return shape


if triton is not None:
    import triton.language as tl

    from rewrite.kernels.aten_math import round_to as _round

    @triton.jit
    def _store(y, out_ptr, res_ptr, bias_ptr, b, t, h, w, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h, so_w,
               sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
        """One output of each block (row h, column w) plus bias and residual in fp32, rounded once, stored."""
        inside = rows_ok & (h < H) & (w < W)
        mask = inside[:, None] & n_ok[None, :]
        if HAS_BIAS:
            y += tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if HAS_RESIDUAL:
            r_off = b * sr_b + t * sr_t + h.to(tl.int64) * sr_h + w.to(tl.int64) * sr_w
            y += tl.load(res_ptr + r_off[:, None] + n[None, :].to(tl.int64) * sr_c, mask=mask, other=0.0).to(tl.float32)
        o_off = b * so_b + t * so_t + h.to(tl.int64) * so_h + w.to(tl.int64) * so_w
        tl.store(out_ptr + o_off[:, None] + n[None, :].to(tl.int64) * so_c, _round(y, out_ptr.dtype.element_ty),
                 mask=mask)

    @triton.jit
    def patch_origin(m, count, TH, TW):
        """For block indices m (frame-major, then rows and columns of 2x2 blocks): whether each is one of the
        `count`, its frame, and its patch's first row and column in the padded plane (int64; m past `count`
        decoded as block 0)."""
        inside = m < count
        m = tl.where(inside, m, 0).to(tl.int64)
        return inside, m // (TW * TH), 2 * ((m // TW) % TH), 2 * (m % TW)

    @triton.jit
    def output_program(FRAME_PATCHES, O, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Where an output-transform program works: its frame (grid axis 1), its `BLOCK_M` blocks of that frame
        (axis 0) and `BLOCK_N` output channels (axis 2), their masks, and the blocks' rows of the sums (frame-major,
        `FRAME_PATCHES` blocks a frame)."""
        frame = tl.program_id(1)
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_ok = m < FRAME_PATCHES
        n_ok = n < O
        return frame, m, n, rows_ok, n_ok, rows_ok[:, None] & n_ok[None, :], frame.to(tl.int64) * FRAME_PATCHES + m

    @triton.jit
    def add_point(acc, point, y00, y01, y10, y11):
        """The output transform A^T M A, one point's fp32 sum at a time (A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]): the
        block's four outputs plus point (r, s)'s coefficients (0 or +-1) times `acc`."""
        r = point // 4
        s = point % 4
        r_first = tl.where(r < 3, 1.0, 0.0)
        r_second = tl.where(r == 0, 0.0, tl.where(r == 1, 1.0, -1.0))
        s_first = tl.where(s < 3, 1.0, 0.0)
        s_second = tl.where(s == 0, 0.0, tl.where(s == 1, 1.0, -1.0))
        return (y00 + (r_first * s_first) * acc, y01 + (r_first * s_second) * acc, y10 + (r_second * s_first) * acc,
                y11 + (r_second * s_second) * acc)

    @triton.jit
    def store_block(y00, y01, y10, y11, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok, rows_ok, H, W, so_b, so_c,
                    so_t, so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
        """The four outputs of each 2x2 block at (h0, w0), by `_store`."""
        _store(y00, out_ptr, res_ptr, bias_ptr, b, t, h0, w0, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h, so_w,
               sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        _store(y01, out_ptr, res_ptr, bias_ptr, b, t, h0, w0 + 1, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h,
               so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        _store(y10, out_ptr, res_ptr, bias_ptr, b, t, h0 + 1, w0, n, n_ok, rows_ok, H, W, so_b, so_c, so_t, so_h,
               so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
        _store(y11, out_ptr, res_ptr, bias_ptr, b, t, h0 + 1, w0 + 1, n, n_ok, rows_ok, H, W, so_b, so_c, so_t,
               so_h, so_w, sr_b, sr_c, sr_t, sr_h, sr_w, HAS_BIAS, HAS_RESIDUAL)
