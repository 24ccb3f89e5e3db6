"""A dense causal 1-D convolution over a channels-last, pre-padded input, as one Triton implicit-GEMM kernel.

Computes, for ``padded`` of shape ``[B, left + T, C]`` (position-major; its first ``left = dilation * (K -
1)`` positions the causal zero pad, as the alias-free activation kernel writes them with
``channels_last_out=True``), ``weight`` ``[O, C, K]`` (any strides), an optional ``bias`` ``[O]`` and an
optional ``residual`` ``[B, O, T]``::

    y[b, o, t] = sum_{k, c} weight[o, c, k] * padded[b, t + k * dilation, c]  (+ bias[o])  (+ residual[b, o, t])

which is ``conv1d(padded.transpose(1, 2), weight, bias, dilation=dilation)`` plus the residual, returned as a
contiguous ``[B, O, T]``: every dense conv of the AuK decoder at level ``channels_last`` but the last (one
output channel).

Why: cuDNN runs these NCHW fp32 convs as NHWC kernels behind a transpose of the input and of the filter
on every call and one of the output (docs/tuning.md section 5, "AuK Triton conv1d"), and picks its algorithm by
shape, so a window of a tiled decode and the whole clip differ in their last bits. Here the
activation writes the input channels-last, so an input tile ``[channels, positions]`` of one tap is
contiguous along the reduction (what the tensor cores read without a transpose), the output comes out in
the layout the next activation reads, and bias and residual are added in the epilogue. The reduction for
an output sample runs tap by tap, channel block by channel block, in `reduction_splits` contiguous slices
whose fp32 partials a second kernel sums in slice order (one slice: no partials): its order depends on (C, K,
BLOCK_C, splits), all functions of the weight's shape, so every window, batch row and clip length computes a
sample the same way. Weights are read through their strides: pass ``packed.permute(0, 2, 1)`` of a
contiguous ``[O, K, C]`` copy (`pack_weight`, or kept between calls by `PackedWeightCache`) for contiguous
weight tiles.

Exactness: ``tolerance`` (level ``channels_last`` only; launched with the tolerance flags of
`rewrite.kernels.launch.launch`). With ``precision="tf32"`` (when
``torch.backends.cudnn.allow_tf32`` is on, PyTorch's default for convolutions) the products are TF32 like
cuDNN's, summed in fp32 in another order; bias and residual are added to the fp32 accumulator (one
rounding less than conv-then-add). fp16/bf16 inputs multiply exactly, accumulate in fp32 and round once.
The tensor cores truncate fp32 operands to TF32, so the caller rounds them to nearest first (the activation
kernel's ``round_tf32``, `pack_weight`): then the full decode is as close to eager as with cuDNN's convs
(measured: docs/tuning.md section 5, "AuK Triton conv1d").

Preconditions (`unsupported_reason`): Triton, one floating dtype for all tensors, ``padded`` contiguous,
``O >= 16`` (a smaller output wastes a tensor-core tile: the caller keeps ATen's conv), TF32 allowed for
fp32 (with it off, cuDNN's exact fp32 conv is the faster one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import operator
import weakref
from typing import Iterator, NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.ops import run_context
from rewrite.kernels import cards, valid_length
from rewrite.kernels.launch import launch

try:  # Triton is optional: without it the callers keep ATen's conv.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with the Linux torch wheels
    triton = None

__all__ = ["MIN_OUT_CHANNELS", "SUPPORTED_DTYPES", "aten_is_faster", "causal_conv1d", "chosen", "launch_config",
           "pack_weight", "packed_weight", "packed_weight_cache", "PackedWeightCache", "precision", "reduction_splits", "rounds_to_tf32", "unsupported_reason"]

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MIN_OUT_CHANNELS = 16  # tl.dot's smallest tile side


def precision(dtype: torch.dtype) -> str:
    """``"tf32"`` for fp32 when cuDNN may use TF32 (PyTorch's default for convs), else ``"ieee"`` (half
    types multiply exactly in fp32 either way)."""
    if dtype == torch.float32 and torch.backends.cudnn.allow_tf32:
        return "tf32"
    return "ieee"


def rounds_to_tf32(dtype: torch.dtype) -> bool:
    """Whether operands of this dtype are rounded to TF32 for the conv (`precision` is ``"tf32"``)."""
    return precision(dtype) == "tf32"


def unsupported_reason(weight: Tensor, dtype: torch.dtype) -> Optional[str]:
    """None when `causal_conv1d` serves this weight and activation dtype, else why not (the caller keeps
    ATen's conv)."""
    if triton is None:
        return "triton is not importable"
    if weight.dim() != 3:
        return f"expected a [O, C, K] weight, got {tuple(weight.shape)}"
    if weight.shape[0] < MIN_OUT_CHANNELS:
        return f"{weight.shape[0]} output channels (< {MIN_OUT_CHANNELS}: a tensor-core tile would be mostly empty)"
    if dtype not in SUPPORTED_DTYPES or weight.dtype != dtype:
        return f"dtypes {dtype} and {weight.dtype} (one of {SUPPORTED_DTYPES} for both)"
    if dtype == torch.float32 and precision(dtype) == "ieee":
        return "TF32 is off (torch.backends.cudnn.allow_tf32): cuDNN's exact fp32 conv is the faster one"
    return None


class ConvShapes(NamedTuple):
    """Undilated convs with `smallest` to `largest` input channels (None: no bound) and `min_ksize` taps or more."""

    smallest: int
    largest: Optional[int]
    min_ksize: int

    def holds(self, in_channels: int, ksize: int) -> bool:
        return (in_channels >= self.smallest and (self.largest is None or in_channels <= self.largest)
                and ksize >= self.min_ksize)


# Undilated convs where cuDNN's conv (with its transposes, its bias and residual pass, and the cheaper NCL
# activation before it) measured faster than this kernel (with its weight packing and the channels-last
# activation); H200 measurements: docs/tuning.md section 5, "AuK Triton conv1d".
_CUDNN_FASTER_UNDILATED = (ConvShapes(96, 191, 7), ConvShapes(256, 767, 7), ConvShapes(768, None, 11))


def aten_is_faster(in_channels: int, ksize: int, dilation: int) -> bool:
    """Whether cuDNN's conv measured faster for this shape (`_CUDNN_FASTER_UNDILATED`): undilated convs only."""
    return dilation == 1 and any(shapes.holds(in_channels, ksize) for shapes in _CUDNN_FASTER_UNDILATED)


def chosen(weight: Tensor, dtype: torch.dtype, dilation: int) -> bool:
    """Whether the fused AuK activation+conv op runs its conv here: supported, not `aten_is_faster`, and on a
    card whose choices were measured (`rewrite.kernels.cards`; any other card keeps cuDNN's conv)."""
    return (unsupported_reason(weight, dtype) is None and cards.unmeasured_card_reason(weight.device) is None
            and not aten_is_faster(weight.shape[1], weight.shape[2], dilation))


def pack_weight(weight: Tensor, out: Optional[Tensor] = None) -> Tensor:
    """``weight`` ``[O, C, K]`` as a view of a contiguous ``[O, K, C]`` copy (contiguous weight tiles), its fp32
    values rounded to the nearest TF32 when the conv runs in TF32 (the tensor cores would truncate them). One
    kernel, writing `out` (a contiguous ``[O, K, C]`` buffer) when given. Run inside a CUDA graph, it repacks on
    every replay; `PackedWeightCache` keeps packed copies between calls instead."""
    out_channels, channels, ksize = weight.shape
    packed = weight.new_empty((out_channels, ksize, channels)) if out is None else out
    total = packed.numel()
    if total:
        launch(_pack_kernel, (triton.cdiv(total, PACK_BLOCK),), weight.contiguous(), packed, channels, ksize, total,
               ROUND_TF32=rounds_to_tf32(weight.dtype), BLOCK=PACK_BLOCK, exact=False)
    return packed.permute(0, 2, 1)


class PackedWeightCache:
    """Packed copies of conv weights (`pack_weight`) kept between calls, for a runner whose CUDA graphs read them
    instead of repacking on every replay (docs/tuning.md section 5, "Packed weights").

    `lookup(weight)` packs a weight the first time and again when it changed: another storage, shape or dtype
    (a new buffer), or a bumped version counter, which every in-place update through the tensor bumps
    (``copy_``, ``load_state_dict``, optimizer steps), or another TF32 setting (in place). `refresh()` re-packs
    every stale entry in place, into the buffer a captured graph reads: call it before replaying such graphs.
    A write that bypasses the version counter (through ``.data`` or a raw pointer) is not seen. Weights without
    a version counter (inference tensors) are never cached: they are packed on every call. Entries go with their
    weights (weak references)."""

    def __init__(self) -> None:
        self._entries: dict[int, _Packed] = {}  # by id(weight)
        # what the last `refresh` left, so that the next one compares it in C-level loops; None after any change
        # to the entries
        self._clean: Optional[_Refreshed] = None

    def __len__(self) -> int:
        return len(self._entries)

    def __deepcopy__(self, memo: dict) -> "PackedWeightCache":
        return PackedWeightCache()  # a copied model has other weights: its copy packs its own

    def lookup(self, weight: Tensor, may_pack: bool = True) -> Tensor:
        """The packed ``[O, C, K]`` view of `weight`, packed now if it is new or stale. With ``may_pack=False``
        (during a CUDA graph capture) a new or stale weight is packed the plain way and not cached."""
        version = _version(weight)
        if version is None:
            return pack_weight(weight)
        state = (version, rounds_to_tf32(weight.dtype))
        entry = self._entries.get(id(weight))
        same_buffer = entry is not None and entry.ref() is weight and entry.data_ptr == weight.data_ptr() \
            and entry.packed.dtype == weight.dtype \
            and entry.packed.shape == (weight.shape[0], weight.shape[2], weight.shape[1])
        if same_buffer and entry.state() == state:
            return entry.packed.permute(0, 2, 1)
        if not may_pack:
            return pack_weight(weight)
        self._clean = None
        if same_buffer:
            return _repack(entry, weight, state)
        packed = pack_weight(weight)
        key = id(weight)
        self._entries[key] = _Packed(weakref.ref(weight, lambda _, key=key: self._forget(key)), weight.data_ptr(),
                                     *state, packed.permute(0, 2, 1))
        return packed

    def _forget(self, key: int) -> None:
        self._entries.pop(key, None)
        self._clean = None

    def _unchanged_since_refresh(self) -> bool:
        """No entry changed since the last `refresh` (four C-level passes over the entries: it runs before
        every replay, where the Python loop of `refresh` costs too much host time: docs/tuning.md section 5)."""
        clean = self._clean
        if clean is None or rounds_to_tf32(torch.float32) != clean.tf32:
            return False
        weights = [ref() for ref in clean.refs]
        return (not any(map(operator.is_, weights, itertools.repeat(None)))
                and list(map(operator.attrgetter("_version"), weights)) == clean.versions
                and list(map(Tensor.data_ptr, weights)) == clean.data_ptrs)

    def refresh(self) -> int:
        """Re-pack, in place, every entry whose weight changed (version counter or TF32 setting) since it was
        packed; returns how many. Entries whose weight died or moved to another storage or dtype are dropped
        (graphs that read the old weight are the runner's to retire)."""
        if self._unchanged_since_refresh():
            return 0
        repacked = 0
        rounding = {dtype: rounds_to_tf32(dtype) for dtype in SUPPORTED_DTYPES}  # the global flag read once
        for key, entry in list(self._entries.items()):
            weight = entry.ref()
            if weight is None or weight.data_ptr() != entry.data_ptr or weight.dtype != entry.packed.dtype:
                self._entries.pop(key, None)
                continue
            state = (_version(weight), rounding.get(weight.dtype, False))
            if entry.state() != state:
                _repack(entry, weight, state)
                repacked += 1
        entries = list(self._entries.values())
        self._clean = _Refreshed([e.ref for e in entries], [e.version for e in entries],
                                 [e.data_ptr for e in entries], rounding[torch.float32])
        return repacked


@dataclasses.dataclass(slots=True)
class _Packed:
    """A `PackedWeightCache` entry: the weight (weakly), the storage and state it was packed from, the buffer."""

    ref: weakref.ref
    data_ptr: int
    version: int
    tf32: bool
    packed: Tensor  # contiguous [O, K, C]

    def state(self) -> tuple[int, bool]:
        return self.version, self.tf32


class _Refreshed(NamedTuple):
    """What a `PackedWeightCache.refresh` left, as parallel lists over the entries (C-level comparisons)."""

    refs: list
    versions: list
    data_ptrs: list
    tf32: bool


def _repack(entry: _Packed, weight: Tensor, state: tuple[int, bool]) -> Tensor:
    """Pack `weight` into its cache entry's buffer, record `state` (version, TF32); the ``[O, C, K]`` view."""
    pack_weight(weight, entry.packed)
    entry.version, entry.tf32 = state
    return entry.packed.permute(0, 2, 1)


def _version(weight: Tensor) -> Optional[int]:
    """The tensor's version counter, None for an inference tensor (which has none)."""
    try:
        return weight._version
    except RuntimeError:
        return None


@contextlib.contextmanager
def packed_weight_cache(cache: Optional[PackedWeightCache]) -> Iterator[None]:
    """Within: `packed_weight` takes packed weights from `cache` (None: pack on every call). A setting of the
    run context (`rewrite.ops.run_context`): in this thread only, so another thread's decode never reads it."""
    with run_context.using(packed_weights=cache):
        yield


def packed_weight(weight: Tensor) -> Tensor:
    """`pack_weight(weight)`, from the active `PackedWeightCache` when there is one. A compile-ahead pass never
    uses the cache (its pack kernels do not run), nor does a CUDA graph capture add to it (a buffer allocated
    there would belong to the graph's pool): a capture reads a fresh cached copy, or packs inside the graph."""
    settings = run_context.current()
    if settings.packed_weights is None or settings.compile_ahead:
        return pack_weight(weight)
    return settings.packed_weights.lookup(weight, may_pack=not (weight.is_cuda
                                                                and torch.cuda.is_current_stream_capturing()))


PACK_BLOCK = 1024
SUM_BLOCK = 1024


class ConvTile(NamedTuple):
    """The conv kernel's tile: BLOCK_O output channels x BLOCK_T positions, BLOCK_C input channels per step."""

    block_o: int
    block_t: int
    block_c: int
    num_warps: int
    num_stages: int


class ConvConfig(NamedTuple):
    """The launch of the convs with at least `min_out_channels` outputs and `min_ksize` taps: `tile`, and the
    reduction in `splits` contiguous slices of the (tap, channel block) loop (1: no partials)."""

    min_out_channels: int
    min_ksize: int
    tile: ConvTile
    splits: int


# The first config that fits; from H200 sweeps (docs/tuning.md section 5, "AuK Triton conv1d"). A split conv has each
# program write an fp32 partial and one more kernel sum them in slice order, adding bias and residual: more
# programs for the large-C convs whose output tiles would not fill the GPU.
_CONFIGS = (
    ConvConfig(512, 1, ConvTile(128, 256, 32, 8, 3), splits=3),
    ConvConfig(256, 7, ConvTile(128, 256, 32, 8, 3), splits=3),
    ConvConfig(128, 1, ConvTile(64, 64, 64, 4, 3), splits=1),
    ConvConfig(64, 1, ConvTile(128, 64, 32, 4, 3), splits=1),
    ConvConfig(40, 1, ConvTile(64, 128, 32, 4, 3), splits=1),
    ConvConfig(0, 1, ConvTile(32, 128, 32, 4, 3), splits=1),
)


def _config(out_channels: int, ksize: int) -> ConvConfig:
    return next(config for config in _CONFIGS if out_channels >= config.min_out_channels and ksize >= config.min_ksize)


def launch_config(out_channels: int, ksize: int) -> ConvTile:
    """The tile (BLOCK_O, BLOCK_T, BLOCK_C, num_warps, num_stages) for a conv with `out_channels` outputs, `ksize`
    taps."""
    return _config(out_channels, ksize).tile


def reduction_splits(out_channels: int, ksize: int) -> int:
    """How many slices the reduction of a conv with `out_channels` outputs and `ksize` taps runs in. A function
    of the weight's shape only, so every window, batch and clip length sums a sample in the same order."""
    return _config(out_channels, ksize).splits


DILATION_ARG = 8  # position of `dilation` in _conv1d_kernel's signature
LIMIT_ARGS = 23  # position of `limit_scale` (then `limit_extra`), not specialized either

if triton is not None:
    from rewrite.kernels.aten_math import round_tf32

    @triton.jit
    def _pack_kernel(w_ptr, out_ptr, C, K, total, ROUND_TF32: tl.constexpr, BLOCK: tl.constexpr):
        """``out[o, k, c] = w[o, c, k]`` (both contiguous), rounded to TF32 when ``ROUND_TF32``."""
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < total
        channel = i % C
        tap = (i // C) % K
        row = i // (C * K)
        value = tl.load(w_ptr + (row * C + channel) * K + tap, mask=mask, other=0.0)
        if ROUND_TF32:
            value = round_tf32(value)
        tl.store(out_ptr + i, value, mask=mask)

    # dilation (argument 8) is not specialized: Triton would compile dilation == 1 apart, one more variant per
    # conv shape. An index, which every Triton version takes (tests check it names "dilation"). The tap count
    # is a plain argument too (only the loop's trip count depends on it): one variant serves K = 3, 7 and 11.
    @triton.jit(do_not_specialize=[DILATION_ARG, LIMIT_ARGS, LIMIT_ARGS + 1])
    def _conv1d_kernel(
        x_ptr, w_ptr, bias_ptr, res_ptr, out_ptr,
        C, O, T, dilation, c_blocks, ksize, splits, split_iters,
        x_batch_stride, w_out_stride, w_in_stride, w_tap_stride,
        res_batch_stride, res_row_stride, out_batch_stride, out_row_stride, out_split_stride,
        limit_ptr, limit_scale, limit_extra,
        HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_O: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    ):
        """One ``[BLOCK_O, BLOCK_T]`` output tile of one batch row and one reduction slice; the reduction runs
        tap by tap, channel block by channel block (one flat loop, so the pipeliner overlaps loads across
        taps). With ``splits > 1`` slice ``s`` covers loop steps ``[s * split_iters, (s + 1) * split_iters)``
        and stores its fp32 partial at ``out_ptr + s * out_split_stride`` (bias and residual come later). With
        ``limit_scale > 0`` a tile starting at or past ``limit_ptr[0] * limit_scale + limit_extra`` returns at
        once (`rewrite.kernels.valid_length`)."""
        pid_t = tl.program_id(0)
        if limit_scale > 0:
            if pid_t * BLOCK_T >= tl.load(limit_ptr) * limit_scale + limit_extra:
                return
        pid_o = tl.program_id(1)
        pid_z = tl.program_id(2)
        batch = (pid_z // splits).to(tl.int64)
        split = pid_z % splits
        offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_o = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
        offs_c = tl.arange(0, BLOCK_C)
        t_mask = offs_t < T
        o_mask = offs_o < O
        x_base = x_ptr + batch * x_batch_stride
        w_rows = w_ptr + offs_o.to(tl.int64)[:, None] * w_out_stride
        acc = tl.zeros((BLOCK_O, BLOCK_T), dtype=tl.float32)
        first = split * split_iters
        last = tl.minimum(first + split_iters, ksize * c_blocks)
        for i in range(first, last):
            tap = i // c_blocks
            channel = (i - tap * c_blocks) * BLOCK_C + offs_c
            c_mask = channel < C
            w = tl.load(w_rows + channel[None, :] * w_in_stride + tap * w_tap_stride,
                        mask=o_mask[:, None] & c_mask[None, :], other=0.0)
            positions = (offs_t + tap * dilation).to(tl.int64)
            x = tl.load(x_base + positions[None, :] * C + channel[:, None], mask=c_mask[:, None] & t_mask[None, :],
                        other=0.0)
            acc = tl.dot(w, x, acc, input_precision=PRECISION)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_o, mask=o_mask, other=0.0).to(tl.float32)[:, None]
        mask = o_mask[:, None] & t_mask[None, :]
        if HAS_RES:
            res = res_ptr + batch * res_batch_stride + offs_o.to(tl.int64)[:, None] * res_row_stride + offs_t[None, :]
            acc += tl.load(res, mask=mask, other=0.0).to(tl.float32)
        out = (out_ptr + split.to(tl.int64) * out_split_stride + batch * out_batch_stride
               + offs_o.to(tl.int64)[:, None] * out_row_stride + offs_t[None, :])
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _sum_splits_kernel(partial_ptr, bias_ptr, res_ptr, out_ptr, O, T, total, splits,
                           res_batch_stride, res_row_stride,
                           HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        """``out = ((partial[0] + partial[1]) + ...) + bias + residual`` over a contiguous ``[B, O, T]``
        (partials ``[splits, B, O, T]`` fp32), the slices summed in order."""
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < total
        acc = tl.load(partial_ptr + i, mask=mask, other=0.0)
        for s in range(1, splits):
            acc += tl.load(partial_ptr + s * total + i, mask=mask, other=0.0)
        row = i // T
        channel = row % O
        if HAS_BIAS:
            acc += tl.load(bias_ptr + channel, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            position = i - row * T
            acc += tl.load(res_ptr + (row // O) * res_batch_stride + channel * res_row_stride + position, mask=mask,
                           other=0.0).to(tl.float32)
        tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=mask)


def causal_conv1d(padded: Tensor, weight: Tensor, bias: Optional[Tensor], dilation: int,
                  residual: Optional[Tensor] = None, config: Optional[ConvTile] = None,
                  splits: Optional[int] = None) -> Tensor:
    """``conv1d(padded.transpose(1, 2), weight, bias, dilation=dilation) (+ residual)`` by the Triton kernel
    (module docstring); ``padded`` ``[B, left + T, C]`` already holds the causal zero pad. Returns a new
    contiguous ``[B, O, T]``. `config` overrides `launch_config` and `splits` `reduction_splits` (probes)."""
    reason = unsupported_reason(weight, padded.dtype)
    if reason is not None:
        raise ValueError(f"causal_conv1d: {reason}")
    if padded.dim() != 3 or padded.shape[2] != weight.shape[1] or not padded.is_contiguous():
        raise ValueError(f"causal_conv1d: expected a contiguous [B, L, C={weight.shape[1]}] input, got "
                         f"{tuple(padded.shape)} with strides {padded.stride()}")
    batch, padded_length, channels = padded.shape
    out_channels, _, ksize = weight.shape
    length = padded_length - dilation * (ksize - 1)
    if length < 1:
        raise ValueError(f"causal_conv1d: {padded_length} padded positions hold no output for K={ksize}, "
                         f"dilation={dilation}")
    if bias is not None and (bias.shape != (out_channels,) or bias.dtype != padded.dtype):
        raise ValueError(f"causal_conv1d: bias must be [{out_channels}] {padded.dtype}, got {tuple(bias.shape)} {bias.dtype}")
    if residual is not None:
        if tuple(residual.shape) != (batch, out_channels, length) or residual.dtype != padded.dtype:
            raise ValueError(f"causal_conv1d: residual must be {(batch, out_channels, length)} {padded.dtype}, got "
                             f"{tuple(residual.shape)} {residual.dtype}")
        if length > 1 and residual.stride(2) != 1:
            residual = residual.contiguous()
    out = padded.new_empty((batch, out_channels, length))
    block_o, block_t, block_c, num_warps, num_stages = config or launch_config(out_channels, ksize)
    splits = reduction_splits(out_channels, ksize) if splits is None else splits
    c_blocks = triton.cdiv(channels, block_c)
    steps = ksize * c_blocks
    split_iters = triton.cdiv(steps, max(1, min(splits, steps)))
    splits = triton.cdiv(steps, split_iters)  # no empty slice
    target = out if splits == 1 else padded.new_empty((splits, batch, out_channels, length), dtype=torch.float32)
    res_strides = residual.stride()[:2] if residual is not None else (0, 0)
    fused = splits == 1
    grid = (triton.cdiv(length, block_t), triton.cdiv(out_channels, block_o), batch * splits)
    launch(
        _conv1d_kernel, grid,
        padded, weight, bias if bias is not None else weight, residual if residual is not None else out, target,
        channels, out_channels, length, dilation, c_blocks, ksize, splits, split_iters,
        padded.stride(0), *weight.stride(), *res_strides, *target.stride()[-3:-1], batch * out_channels * length,
        *valid_length.kernel_args(length, padded.device),
        HAS_BIAS=fused and bias is not None, HAS_RES=fused and residual is not None,
        PRECISION=precision(padded.dtype),
        BLOCK_O=block_o, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=num_warps, num_stages=num_stages, exact=False,
    )
    if not fused:
        total = out.numel()
        launch(
            _sum_splits_kernel, (triton.cdiv(total, SUM_BLOCK),),
            target, bias if bias is not None else weight, residual if residual is not None else out, out,
            out_channels, length, total, splits, *res_strides,
            HAS_BIAS=bias is not None, HAS_RES=residual is not None, BLOCK=SUM_BLOCK, exact=False)
    return out
