"""Custom ops for the Wan decoder's fusion families, in the `rewrite` torch.library namespace.

Each op has a *reference implementation* (`rewrite.models.wan.reference`: the same ATen ops, in the same order,
as the subgraph it replaces, so a rewritten graph running it is `torch.equal` to the captured one on any
device and dtype), a fake implementation for export/compile tracing, and, where it pays, Triton kernels
(`rewrite.kernels.norm.rms_norm`, `triton_pad`, `triton_epilogue`, `triton_upsample`) that keep every rounding of
the reference, used only where `rewrite.ops.dispatch.use_kernel` allows it (CUDA, supported dtype, no
autograd, not compiling). What each op returns, and in which layout, is `rewrite.kernels.layout`'s. The conv ops
whose kernel path reads a channels-last weight declare it (`rewrite.ops.op_info.reads_channels_last_weight`).

Ops know nothing of graphs, patterns or the API.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from rewrite.ops import cache_into, selftest
from rewrite.kernels import layout
from rewrite.kernels.epilogue import epilogue as triton_epilogue
from rewrite.kernels.norm import rms_norm as triton_norm
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.kernels.upsample import upsample as triton_upsample
from rewrite.ops.cache_into import writes_next_caches
from rewrite.ops.dispatch import use_kernel
from rewrite.kernels.layout import (cat_memory_format, channels_last_cache, conv_output_shape, frame_major, padded_shape,
                                reference_layout, upsample_conv2d_output_shape)
from rewrite.ops.op_info import reads_channels_last_weight
from rewrite.models.wan.reference import (CACHE_MODES, causal_conv3d_reference, causal_conv_input_reference,
                                       conv3d_residual_reference, dup_up_add_reference, next_cache_reference,
                                       pointwise_conv3d_reference, rms_norm_causal_conv3d_reference,
                                       rms_norm_reference, temporal_interleave_reference,
                                       upsample_conv2d_dup_up_add_reference, upsample_conv2d_reference,
                                       upsample_nearest2x_reference)

aten = torch.ops.aten
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class ConvStage(NamedTuple):
    """One normalized causal conv: the RMS norm (+ `act`) of its input, and the conv reading the causally padded,
    cached result, in `rms_norm_causal_conv3d`'s argument order. The pair and chain ops take their stages as
    these; the patterns name their arguments with it (`rewrite.engine.pattern`: one placeholder per field)."""

    gamma: Tensor
    scale: float
    norm_bias: float
    eps: float
    upcast: bool
    act: Optional[str]
    cache: Optional[Tensor]
    pad: list[int]
    mode: str
    weight: Tensor
    bias: Optional[Tensor]


# The fakes give each output the layout the op returns (its reference's, but for the causal convs' next cache,
# channels-last): from the shape formulas of `rewrite.kernels.layout` and the memory formats ATen's kernels pick
# (`suggest_memory_format`, `cat_memory_format`), or from single-input ATen calls on the fake inputs. They run
# no ATen op joining two inputs of the captured graph (a `cat` of the cache and x, an add of a residual): under
# the graph's shape environment that would unify, and could specialize, their symbolic sizes.
def _like(t: Tensor) -> Tensor:
    """A fresh empty tensor of `t`'s size, strides and dtype (a fake's outputs must not alias its inputs)."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


# ---- RMS norm (+ SiLU) -------------------------------------------------------------------------------
@torch.library.custom_op("rewrite::rms_norm", mutates_args=())
def rms_norm(x: Tensor, gamma: Tensor, scale: float, bias: float, eps: float, upcast: bool,
             act: Optional[str], norm_rows: Optional[int] = None) -> Tensor:
    """Wan's channel-first RMS norm with an optional fused activation ("silu" or None).

    `norm_rows`: x is a band (rows in dim -2) of a tensor of that many rows, and the fused kernel sums in
    the order ATen's norm has for that tensor (`aten_reduction.plan`; a sharded decode's band graphs);
    the reference path is ATen's norm of x itself."""
    if x.dim() in (4, 5) and gamma.numel() == x.shape[1] and use_kernel("rms_norm", (x, gamma), FLOAT_DTYPES):
        fused_silu = act == "silu" and selftest.silu_is_exact(x.device, x.dtype)
        return triton_norm.rms_norm(x, gamma, scale, bias, eps, upcast, act, fused_silu=fused_silu, rows=norm_rows)
    return rms_norm_reference(x, gamma, scale, bias, eps, upcast, act)


@rms_norm.register_fake
def _(x, gamma, scale, bias, eps, upcast, act, norm_rows=None):
    return torch.empty_like(x)  # elementwise over x (and x's norm): x's layout


# ---- causal conv input assembly and the next cache ------------------------------------------------------
@torch.library.custom_op("rewrite::causal_conv_input", mutates_args=())
def causal_conv_input(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str) -> tuple[Tensor, Tensor]:
    """Cache concatenation + zero pad of a causal conv's input, and the cache for the next chunk, in one op.

    The pad kernel writes a contiguous padded input: it serves where the replaced pad's output is contiguous
    (not where ATen keeps a channels-last x's, and cache's, memory); the next cache is the reference's."""
    tensors = (x,) if cache is None else (x, cache)
    if (x.dim() == 5 and len(pad) == 6 and min(pad) >= 0 and use_kernel("causal_conv_input", tensors, FLOAT_DTYPES)
            and _padded_format(x, cache, mode) == torch.contiguous_format):
        return triton_pad.causal_pad(x, cache if mode != "chunk0" else None, pad), next_cache_reference(x, cache, mode)
    return causal_conv_input_reference(x, cache, pad, mode)


def _padded_format(x: Tensor, cache: Optional[Tensor], mode: str) -> torch.memory_format:
    """The memory format of `causal_conv_input_reference`'s padded input: the pad keeps the suggested format of
    its input, x or the `cat` of the cache and x."""
    return cat_memory_format(x) if mode == "chunk0" or cache is None else cat_memory_format(cache, x)


def _plain_causal_layouts(x_shape, x_order: Optional[tuple], cache: Optional[Tensor], mode: str):
    """(padded input's memory format, next cache's shape, what lays the next cache out) that
    `causal_conv_input_reference` gives an x of `x_shape` laid out plainly in `x_order` (`layout.plain_order`),
    decided from the layouts alone; None where that shortcut does not apply (the fakes then make the
    intermediate tensors). The next cache is laid out in a dim order (mode steady: `empty_like` of x's last
    frames keeps x's order) or in a memory format (the other modes `cat` x's last frames with zeros like them
    in chunk 0, else with the cache's last frame, whose suggested format is read from the cache's strides: a
    view keeps them)."""
    if x_order is None or cache is not None and (cache.dim() != 5 or not isinstance(cache.shape[2], int)):
        return None
    b, c, t, h, w = x_shape
    x_format = layout.order_memory_format(x_order)
    own = mode == "chunk0" or cache is None
    padded_format = x_format if own or layout.suggest_memory_format(cache) == x_format else torch.contiguous_format
    if mode == "steady":
        return padded_format, (b, c, min(t, 2), h, w), ("order", x_order)
    first = x_format if own else layout.strides_memory_format(
        (cache.shape[0], cache.shape[1], min(cache.shape[2], 1), cache.shape[3], cache.shape[4]), cache.stride())
    return padded_format, (b, c, 2, h, w), ("format", x_format if first == x_format else torch.contiguous_format)


def _plain_empty(shape, like: Tensor, how: tuple) -> Tensor:
    """The empty tensor `_plain_causal_layouts` describes: ("order", dim order) or ("format", memory format)."""
    kind, value = how
    return layout.empty_in_order(shape, like, value) if kind == "order" else layout.empty(shape, like, value)


def _causal_conv_input_fake(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str) -> tuple[Tensor, Tensor]:
    """(padded input, next cache) as `causal_conv_input_reference` lays them out. The next cache: mode steady
    clones x's last two frames (their layout); the other modes `cat` two 1-frame pieces, zeros like x's last
    frames or the cache's last frame, and x's last frames. A plainly laid out x (`_plain_causal_layouts`) makes
    two tensors only: making and viewing fakes of symbolic sizes was most of what the rewrites cost."""
    plain = _plain_causal_layouts(x.shape, layout.plain_order(x), cache, mode)
    if plain is not None:
        padded_format, next_shape, next_layout = plain
        return (layout.empty(padded_shape(x.shape, cache, pad, mode), x, padded_format),
                _plain_empty(next_shape, x, next_layout))
    padded = layout.empty(padded_shape(x.shape, cache, pad, mode), x, _padded_format(x, cache, mode))
    tail = torch.empty_like(x[:, :, -2:])
    if mode == "steady":
        return padded, tail
    first = tail if mode == "chunk0" or cache is None else cache[:, :, -1:]
    b, c, _, h, w = x.shape
    return padded, layout.empty((b, c, 2, h, w), x, cat_memory_format(first, tail))


@causal_conv_input.register_fake
def _(x, cache, pad, mode):
    return _causal_conv_input_fake(x, cache, pad, mode)


# ---- conv3d (bias included) + residual add -------------------------------------------------------------
@torch.library.custom_op("rewrite::conv3d_residual", mutates_args=())
def conv3d_residual(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Tensor) -> Tensor:
    """`conv3d(x, weight, bias) + residual` (unit stride, no padding: causal convs pad explicitly).

    The kernel path runs the conv without its bias and adds bias and residual in one pass: ATen's CUDA
    conv adds the bias in a separate `add_` after cuDNN, so the two roundings are the same.
    """
    tensors = (x, weight, residual) if bias is None else (x, weight, bias, residual)
    if x.is_cuda and use_kernel("conv3d_residual", tensors, FLOAT_DTYPES):
        return triton_epilogue.bias_residual(aten.conv3d.default(x, weight, None), bias, residual)
    return conv3d_residual_reference(x, weight, bias, residual)


def _conv_add_fake(conv_out: Tensor) -> Tensor:
    """`conv_out + residual` (same shapes): ATen's add takes the layout of its first operand, a dense conv output."""
    return torch.empty_like(conv_out)


@conv3d_residual.register_fake
def _(x, weight, bias, residual):
    return _conv_add_fake(aten.conv3d.default(x, weight, bias))


# ---- causal conv3d: input assembly, channels-last conv, bias (+ residual) ---------------------------------
def channels_last_conv_input_shape(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
                                   residual: Optional[Tensor]) -> Optional[tuple[int, ...]]:
    """The padded input's shape where the channels-last path handles this causal conv's shapes (a 1-frame
    chunk in modes chunk0 and steady_t1, 2 frames for the next cache, a residual of the output's shape), else
    None. The ``channels_last`` twin (`rewrite.models.wan.ops_fast`) shares these conditions."""
    if x.dim() != 5 or weight.dim() != 5 or len(pad) != 6 or min(pad) < 0 or mode not in CACHE_MODES:
        return None
    in_shape = padded_shape(x.shape, cache, pad, mode)
    if ((residual is None or list(residual.shape) == conv_output_shape(in_shape, weight.shape)) and weight.shape[1] == x.shape[1]
            and in_shape[2] - pad[5] >= 2 and (x.shape[2] >= 2) == (mode == "steady")):
        return in_shape
    return None


def _channels_last_conv_serves(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
                               residual: Optional[Tensor]) -> bool:
    """Whether the channels-last path may serve this causal conv: shapes it handles
    (`channels_last_conv_input_shape`) and a conv shape for which `selftest.channels_last_conv_is_exact` holds
    on this device."""
    in_shape = channels_last_conv_input_shape(x, cache, pad, mode, weight, residual)
    return in_shape is not None and selftest.channels_last_conv_is_exact(in_shape, tuple(weight.shape), x.dtype,
                                                                          x.device)


def channels_last_conv(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                        residual_bias: Optional[Tensor] = None) -> Tensor:
    """cuDNN's conv of the channels-last padded input and weight without bias, then bias (+ residual [+ its
    deferred bias]) with ATen's roundings into the replaced subgraph's layout."""
    y = channels_last_conv_raw(padded, weight)
    return triton_epilogue.conv_epilogue(y, bias, residual, layout.conv_output_strides(list(y.shape), residual),
                                         residual_bias=residual_bias)


def channels_last_conv_raw(padded: Tensor, weight: Tensor) -> Tensor:
    """cuDNN's conv, without bias, of the channels-last padded input with the channels-last weight."""
    return aten.conv3d.default(padded, weight.contiguous(memory_format=torch.channels_last_3d), None)


@reads_channels_last_weight("weight")
@torch.library.custom_op("rewrite::causal_conv3d", mutates_args=())
def causal_conv3d(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
                  bias: Optional[Tensor], residual: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """A Wan causal conv3d from its unpadded input: (output [+ residual], next cache).

    Kernel path: the pad kernel writes the padded input channels-last (NDHWC) and, in the same pass, the next
    cache (its values; channels-last too: caches only come back to this op), cuDNN convolves the padded input
    with the channels-last weight without bias (no layout transposes around the conv), and one kernel adds
    bias and residual with ATen's roundings while writing the output in the layout the replaced subgraph has. Used
    only where `selftest.channels_last_conv_is_exact` found cuDNN's channels-last conv `torch.equal` to its
    NCDHW conv for this shape; else the same ops as `causal_conv_input` + conv (+ `conv3d_residual`).

    Layouts: the output's is the replaced subgraph's; the next cache is channels-last on both paths (what the
    pad kernel writes; the reference path copies its cache so: `layout.channels_last_cache`).
    """
    tensors = tuple(t for t in (x, cache, weight, bias, residual) if t is not None)
    if use_kernel("causal_conv3d", tensors, FLOAT_DTYPES) and _channels_last_conv_serves(x, cache, pad, mode, weight,
                                                                                          residual):
        padded, next_cache = triton_pad.causal_pad_channels_last(x, cache if mode != "chunk0" else None, pad)
        return channels_last_conv(padded, weight, bias, residual), next_cache
    out, next_cache = causal_conv3d_reference(x, cache, pad, mode, weight, bias, residual)
    return out, channels_last_cache(next_cache)


def _plain_causal_conv3d_fake(x: Tensor, x_order: Optional[tuple], cache: Optional[Tensor], pad: list[int],
                              mode: str, weight: Tensor, bias: Optional[Tensor],
                              channels_last_out: bool = False) -> Optional[tuple[Tensor, Tensor]]:
    """`_causal_conv3d_fake`'s outputs (with `channels_last_out`, the raw output channels-last) where the conv's
    input, x or a tensor of x's shape, dtype and device, is laid out plainly in `x_order` and its padded input
    is contiguous, without making the padded input or the conv's output; None where that does not hold.

    A conv of a contiguous input and a contiguous weight is contiguous on every backend (cuDNN and oneDNN go
    channels-last only for a channels-last operand); the add of a residual (`_conv_add_fake`) and `_like`
    keep it. The next cache, plainly laid out with 2 or more channels, is channels-last already (it is then
    returned as it is) or is copied so (`layout.channels_last_cache`)."""
    plain = _plain_causal_layouts(x.shape, x_order, cache, mode)
    if (plain is None or plain[0] != torch.contiguous_format or weight.dim() != 5 or not isinstance(x.shape[1], int)
            or weight.shape[1] != x.shape[1]
            or any(t is not None and (t.dtype != x.dtype or t.device != x.device) for t in (weight, bias))):
        return None  # a channels-last padded input, or a call the conv refuses: the general fake decides
    _, next_shape, next_layout = plain
    out_shape = conv_output_shape(padded_shape(x.shape, cache, pad, mode), weight.shape)
    out = layout.empty(out_shape, x, torch.channels_last_3d if channels_last_out else torch.contiguous_format)
    if next_layout in (("order", layout.CHANNELS_LAST_ORDER), ("format", torch.channels_last_3d)):
        return out, _plain_empty(next_shape, x, next_layout)
    return out, layout.empty(next_shape, x, torch.channels_last_3d)


def _causal_conv3d_fake(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
                        bias: Optional[Tensor], residual: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """`causal_conv3d_reference`'s output layout (the conv of the padded input, the add's), a channels-last
    next cache."""
    fast = _plain_causal_conv3d_fake(x, layout.plain_order(x), cache, pad, mode, weight, bias)
    if fast is not None:
        return fast
    padded, next_cache = _causal_conv_input_fake(x, cache, pad, mode)
    out = aten.conv3d.default(padded, aten.contiguous.default(weight), bias)
    out = _like(out) if residual is None else _conv_add_fake(out)
    return out, channels_last_cache(next_cache)


@causal_conv3d.register_fake
def _(x, cache, pad, mode, weight, bias, residual):
    return _causal_conv3d_fake(x, cache, pad, mode, weight, bias, residual)


# ---- nearest-exact 2x spatial upsample -----------------------------------------------------------------
@torch.library.custom_op("rewrite::upsample_nearest2x", mutates_args=())
def upsample_nearest2x(x: Tensor, upcast: bool) -> Tensor:
    """`interpolate(x[.float()], scale_factor=2, mode="nearest-exact")[.to(x.dtype)]` on [N, C, H, W], any strides
    (the steady graph's input is a frame-major view); the output gets the layout ATen gives it."""
    if x.dim() == 4 and use_kernel("upsample_nearest2x", (x,), FLOAT_DTYPES):
        return triton_upsample.upsample_nearest2x(x, upcast)  # exactly 2x nearest-exact duplicates pixels
    return upsample_nearest2x_reference(x, upcast)


@upsample_nearest2x.register_fake
def _(x, upcast):
    n, c, h, w = x.shape  # ATen's upsample keeps x's suggested memory format
    return layout.empty((n, c, 2 * h, 2 * w), x, layout.suggest_memory_format(x))


# ---- RMS norm (+ SiLU) feeding a causal conv3d ------------------------------------------------------------
def fused_norm_applies(x: Tensor, gamma: Tensor, act: Optional[str], op: str, tensors: tuple[Tensor, ...],
                       dtypes: tuple[torch.dtype, ...]) -> bool:
    """The call conditions of the fused norm + conv kernel path of `op` (a 5-D x, one gamma per channel, SiLU
    or no activation, `use_kernel`)."""
    return (x.dim() == 5 and gamma.numel() == x.shape[1] and act in ("silu", None)
            and use_kernel(op, tensors, dtypes))


def fused_norm_plan(x: Tensor, upcast: bool, act: Optional[str], x_bias: Optional[Tensor],
                    rows: Optional[int] = None):
    """The norm kernel's plan where it reproduces ATen's norm of x (`layout.norm_plan`; of the tensor of
    `rows` rows that x is a band of, if given) and SiLU, if any, is proven exact on this device
    (`selftest.silu_is_exact`); else None."""
    plan = layout.norm_plan(x, upcast, reference_contiguous=x_bias is not None, rows=rows)
    if plan is None or (act is not None and not selftest.silu_is_exact(x.device, x.dtype)):
        return None
    return plan


def norm_into_padded_input(x: Tensor, gamma: Tensor, scale: float, norm_bias: float, eps: float, upcast: bool,
                           act: Optional[str], cache: Optional[Tensor], pad: list[int], mode: str, plan,
                           x_bias: Optional[Tensor], next_cache: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The fused norm (+ SiLU) stored into the conv's padded channels-last input, and the next cache (into
    `next_cache` if given: `rewrite.ops.cache_into`)."""
    return triton_norm.rms_norm_padded_channels_last(x, gamma, scale, norm_bias, eps, upcast, act == "silu", plan.split,
                                                     cache if mode != "chunk0" else None, pad, plan.ctas, x_bias=x_bias,
                                                     next_cache=next_cache, pieces=plan.pieces)


@writes_next_caches({1: "cache"})
@reads_channels_last_weight("weight")
@torch.library.custom_op("rewrite::rms_norm_causal_conv3d", mutates_args=())
def rms_norm_causal_conv3d(x: Tensor, gamma: Tensor, scale: float, norm_bias: float, eps: float, upcast: bool,
                           act: Optional[str], cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
                           bias: Optional[Tensor], residual: Optional[Tensor], x_bias: Optional[Tensor] = None,
                           residual_bias: Optional[Tensor] = None,
                           channels_last_out: bool = False, norm_rows: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """`causal_conv3d(rms_norm(with_deferred_bias(x, x_bias), ...), cache, pad, mode, weight, bias,
    with_deferred_bias(residual, residual_bias))`, the output channels-last (NDHWC memory) if
    `channels_last_out` (only without bias and residual: a raw conv output for another such op's `x`).

    `x_bias` / `residual_bias`: x / the residual is a conv output whose bias was left out (any layout); its
    value is the contiguous conv output plus the bias (`with_deferred_bias`), and the norm sums in the order
    ATen's norm has for that contiguous tensor.

    Kernel path: the fused norm kernel stores the normalized (+ SiLU) values straight into the conv's padded
    channels-last input and into the next cache (adding x's deferred bias as it reads x); the pad kernel writes
    only the cache frames and the zero pad; then the conv and epilogue of `causal_conv3d` (the residual's
    deferred bias added in the epilogue), or no epilogue for `channels_last_out`. Where a piece is not
    available (ATen's norm order not reproduced for x, SiLU not proven exact on this device, the channels-last
    conv not proven equal for the shape) the ops run one after the other.

    `norm_rows`: as for `rms_norm` (x a band; the fused norm sums in the whole tensor's order). The kernel
    path writes the next cache into a buffer `rewrite.ops.cache_into` gives it.
    """
    into = cache_into.taken()
    if channels_last_out and (bias is not None or residual is not None):
        raise ValueError("rms_norm_causal_conv3d: channels_last_out is for the raw conv output (no bias, no residual)")
    if residual_bias is not None and residual is None:
        raise ValueError("rms_norm_causal_conv3d: residual_bias without a residual")
    tensors = tuple(t for t in (x, gamma, cache, weight, bias, residual, x_bias, residual_bias) if t is not None)
    if fused_norm_applies(x, gamma, act, "rms_norm_causal_conv3d", tensors, FLOAT_DTYPES):
        plan = fused_norm_plan(x, upcast, act, x_bias, norm_rows)
        if plan is not None and _channels_last_conv_serves(x, cache, pad, mode, weight, residual):
            cache_read = cache if mode != "chunk0" else None
            padded, next_cache = norm_into_padded_input(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode,
                                                        plan, x_bias, cache_into.buffer_for(into.get(1), cache_read, x))
            if channels_last_out:  # cuDNN's output of channels-last operands is channels-last already
                y = channels_last_conv_raw(padded, weight)
                return y.contiguous(memory_format=torch.channels_last_3d), next_cache
            return channels_last_conv(padded, weight, bias, residual, residual_bias), next_cache
    return rms_norm_causal_conv3d_reference(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight,
                                            bias, residual, x_bias, residual_bias, channels_last_out)


def _rms_norm_causal_conv3d_fake(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias,
                                 residual, x_bias=None, residual_bias=None, channels_last_out=False, norm_rows=None):
    """The outputs `rms_norm_causal_conv3d_reference` returns, as empty tensors of their layouts (also the
    fake of the ``channels_last`` twin, `rewrite.models.wan.ops_fast`)."""
    # as the reference: a deferred bias completed on the contiguous tensor, the norm in its input's layout
    if x_bias is None:
        normalized_order = layout.plain_order(x)  # empty_like of a plainly laid out tensor: laid out the same
    else:
        normalized_order = layout.CONTIGUOUS_ORDER if x.dim() == 5 and layout.plain_shape(x.shape) else None
    fast = _plain_causal_conv3d_fake(x, normalized_order, cache, pad, mode, weight, bias, channels_last_out)
    if fast is not None:
        return fast
    normalized = torch.empty_like(x) if x_bias is None else layout.empty(x.shape, x)
    if residual is not None and residual_bias is not None:
        residual = layout.empty(residual.shape, residual)
    out, next_cache = _causal_conv3d_fake(normalized, cache, pad, mode, weight, bias, residual)
    if channels_last_out:
        out = layout.empty(out.shape, out, torch.channels_last_3d)
    return out, next_cache


rms_norm_causal_conv3d.register_fake(_rms_norm_causal_conv3d_fake)


# ---- nearest-exact 2x upsample feeding a conv2d (Wan's Resample) ------------------------------------------
def _upsample_channels_last_conv_serves(x: Tensor, weight: Tensor, stride: list[int], padding: list[int]) -> bool:
    """Whether the channels-last path may serve the conv2d of the 2x-upsampled x: a unit-stride 2-D conv whose
    shape `selftest.channels_last_conv_is_exact` found equal to the NCHW conv on this device."""
    if not (x.dim() == 4 and weight.dim() == 4 and list(stride) == [1, 1] and len(padding) == 2
            and weight.shape[1] == x.shape[1]):
        return False
    n, c, h, w = x.shape
    return selftest.channels_last_conv_is_exact((n, c, 2 * h, 2 * w), tuple(weight.shape), x.dtype, x.device,
                                                tuple(padding))


def _upsample_channels_last_conv(x: Tensor, weight: Tensor, stride: list[int], padding: list[int]) -> Tensor:
    """cuDNN's conv2d, without bias, of x upsampled 2x straight into channels-last memory, channels-last weight."""
    return aten.conv2d.default(triton_upsample.upsample_nearest2x_channels_last(x),
                               weight.contiguous(memory_format=torch.channels_last), None, stride, padding)


@reads_channels_last_weight("weight")
@torch.library.custom_op("rewrite::upsample_conv2d", mutates_args=())
def upsample_conv2d(x: Tensor, upcast: bool, weight: Tensor, bias: Optional[Tensor], stride: list[int],
                    padding: list[int]) -> Tensor:
    """`conv2d(upsample_nearest2x(x, upcast), weight, bias, stride, padding)`.

    Kernel path: the upsample kernel writes the duplicated pixels channels-last (NHWC), cuDNN convolves them
    with the channels-last weight (its own zero padding) without bias, and `conv_epilogue` adds the bias with
    ATen's rounding while writing the layout the replaced conv gives. Used only where
    `selftest.channels_last_conv_is_exact` found that conv `torch.equal` to the NCHW one for this shape.
    """
    tensors = (x, weight) if bias is None else (x, weight, bias)
    if use_kernel("upsample_conv2d", tensors, FLOAT_DTYPES) and _upsample_channels_last_conv_serves(x, weight, stride,
                                                                                                    padding):
        strides = reference_layout(("upsample_conv2d", upcast, tuple(padding)),
                                   lambda a, wt: upsample_conv2d_reference(a, upcast, wt, None, [1, 1], padding),
                                   x, weight)
        y = _upsample_channels_last_conv(x, weight, stride, padding)
        out = triton_epilogue.conv_epilogue(y.unsqueeze(2), bias, None, (strides[0], strides[1], 0, *strides[2:]))
        return out.squeeze(2)
    return upsample_conv2d_reference(x, upcast, weight, bias, stride, padding)


@upsample_conv2d.register_fake
def _(x, upcast, weight, bias, stride, padding):
    # the conv of the upsampled x (in x's suggested format) with the contiguous weight keeps that format
    shape = upsample_conv2d_output_shape(x.shape, weight.shape, padding)
    return layout.empty(shape, x, layout.suggest_memory_format(x))


# ---- temporal interleave after time_conv ----------------------------------------------------------------
@torch.library.custom_op("rewrite::temporal_interleave", mutates_args=())
def temporal_interleave(y: Tensor) -> Tensor:
    """[b, 2c, t, h, w] -> [b, c, 2t, h, w]: channel halves become interleaved frames (Wan's upsample3d); the
    kernel path copies once (`triton_upsample.temporal_interleave`), exact (data movement)."""
    if y.dim() == 5 and y.shape[1] % 2 == 0 and use_kernel("temporal_interleave", (y,), FLOAT_DTYPES):
        return triton_upsample.temporal_interleave(y)
    return temporal_interleave_reference(y)


@temporal_interleave.register_fake
def _(y):
    return temporal_interleave_reference(y)  # the reference's layout: contiguous, channels-last for such a y


# ---- Wan 2.2 DupUp3D shortcut + add ---------------------------------------------------------------------
@torch.library.custom_op("rewrite::dup_up_add", mutates_args=())
def dup_up_add(main: Tensor, x: Tensor, repeats: int, unfold_shape: list[int], fold_shape: list[int],
               first_frame: int) -> Tensor:
    """`main + DupUp3D(x)`: repeat channels, unfold into (t, h, w) factors, [drop the first frames,] add."""
    if (x.dim() == 5 and len(unfold_shape) == 8 and main.dtype == x.dtype
            and use_kernel("dup_up_add", (main, x), FLOAT_DTYPES)):
        return triton_upsample.dup_up_add(main, x, repeats, int(unfold_shape[2]), int(unfold_shape[3]), first_frame)
    return dup_up_add_reference(main, x, repeats, unfold_shape, fold_shape, first_frame)


@dup_up_add.register_fake
def _(main, x, repeats, unfold_shape, fold_shape, first_frame):
    return torch.empty_like(main)  # ATen's add takes the layout of its first operand, main


# ---- Wan 2.2 up block end: upsample + conv2d, then the DupUp3D shortcut added -----------------------------
@reads_channels_last_weight("weight")
@torch.library.custom_op("rewrite::upsample_conv2d_dup_up_add", mutates_args=())
def upsample_conv2d_dup_up_add(x: Tensor, upcast: bool, weight: Tensor, bias: Optional[Tensor], stride: list[int],
                               padding: list[int], frames_shape: list[int], dx: Tensor, repeats: int,
                               unfold_shape: list[int], fold_shape: list[int], first_frame: int) -> Tensor:
    """The end of a Wan 2.2 up block: the upsampler's 2x upsample + conv2d over the frames folded into the
    batch, unfolded to [b, c, t, h, w] (`frames_shape` is the [b, t, c, h, w] view), plus the DupUp3D
    shortcut of the block input `dx`.

    Kernel path: `upsample_conv2d`'s channels-last upsample and conv, then one epilogue pass that adds the
    bias (ATen's rounding), gathers the shortcut from `dx` and adds it (the add's rounding), writing the
    layout of the replaced add: the conv output is never stored in the reference layout and read back.
    Same conditions as the two ops' kernel paths; else the two ops run.
    """
    tensors = tuple(t for t in (x, weight, bias, dx) if t is not None)
    if (dup_up_epilogue_fits(x, frames_shape, dx, unfold_shape)
            and use_kernel("upsample_conv2d_dup_up_add", tensors, FLOAT_DTYPES)
            and _upsample_channels_last_conv_serves(x, weight, stride, padding)):
        b, t = int(frames_shape[0]), int(frames_shape[1])
        strides = upsample_conv2d_dup_up_add_layout(x, upcast, weight, padding, b, t, dx, repeats, unfold_shape,
                                                    fold_shape, first_frame)
        y = _upsample_channels_last_conv(x, weight, stride, padding)
        y5 = y.view(b, t, *y.shape[1:]).permute(0, 2, 1, 3, 4)
        dup_up = triton_epilogue.DupUp(dx, repeats, int(unfold_shape[2]), int(unfold_shape[3]), first_frame)
        return triton_epilogue.conv_epilogue(y5, bias, None, strides, dup_up=dup_up)
    return upsample_conv2d_dup_up_add_reference(x, upcast, weight, bias, stride, padding, frames_shape, dx, repeats,
                                                unfold_shape, fold_shape, first_frame)


def dup_up_epilogue_fits(x: Tensor, frames_shape: list[int], dx: Tensor, unfold_shape: list[int]) -> bool:
    """The DupUp epilogue (`triton_epilogue.conv_epilogue` with `DupUp`) can gather `dx`'s shortcut onto the
    upsampler's conv of the frames x: a 5-D dx of x's dtype, an 8-D unfold, and [b, t, ...] frames with
    b * t = x's batch."""
    return (dx.dim() == 5 and len(frames_shape) == 5 and len(unfold_shape) == 8 and dx.dtype == x.dtype
            and int(frames_shape[0]) * int(frames_shape[1]) == x.shape[0])


def upsample_conv2d_dup_up_add_layout(x: Tensor, upcast: bool, weight: Tensor, padding: list[int], b: int, t: int,
                                      dx: Tensor, repeats: int, unfold_shape: list[int], fold_shape: list[int],
                                      first_frame: int) -> tuple[int, ...]:
    """The strides of `upsample_conv2d_dup_up_add`'s output (the replaced add's layout) for these operands."""
    return reference_layout(
        ("upsample_conv2d_dup_up_add", upcast, tuple(padding), repeats, first_frame),
        lambda a, wt, d: upsample_conv2d_dup_up_add_reference(
            a, upcast, wt, None, [1, 1], padding, [b, t, *upsample_conv2d_output_shape(a.shape, wt.shape, padding)[1:]],
            d, repeats, unfold_shape, fold_shape, first_frame),
        x, weight, dx)


def upsample_conv2d_dup_up_add_fake(x: Tensor, weight: Tensor, padding: list[int], frames_shape: list[int]) -> Tensor:
    """`upsample_conv2d_dup_up_add`'s fake output (also that of the ``channels_last`` op replacing it): the
    layout of ATen's add of the conv output's frames (the conv keeps x's suggested format, as
    `upsample_conv2d`'s fake) and the contiguous DupUp3D shortcut."""
    shape = upsample_conv2d_output_shape(x.shape, weight.shape, padding)
    b, t = frames_shape[0], frames_shape[1]
    main = layout.empty(shape, x, layout.suggest_memory_format(x)).view(b, t, *shape[1:]).permute(0, 2, 1, 3, 4)
    return torch.add(main, torch.empty_like(main, memory_format=torch.contiguous_format))


@upsample_conv2d_dup_up_add.register_fake
def _(x, upcast, weight, bias, stride, padding, frames_shape, dx, repeats, unfold_shape, fold_shape, first_frame):
    return upsample_conv2d_dup_up_add_fake(x, weight, padding, frames_shape)


# ---- 1x1x1 conv of a frame-major input (Wan 2.2's resnet shortcuts) -----------------------------------------
def _empty_frame_major_output(x: Tensor, weight: Tensor) -> Tensor:
    """An empty frame-major [b, c_out, t, h, w] output: what `pointwise_conv3d` returns for a frame-major x."""
    b, _, t, h, w = x.shape
    return x.new_empty((b, t, weight.shape[0], h, w)).permute(0, 2, 1, 3, 4)


@torch.library.custom_op("rewrite::pointwise_conv3d", mutates_args=())
def pointwise_conv3d(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
    """`conv3d(pad(x, zeros), weight, bias)` for a [c_out, c_in, 1, 1, 1] weight, returned frame-major
    ([b, t, c, h, w] memory) when x is frame-major, else in the reference layout.

    A 1x1x1 conv treats every frame alike, so for a frame-major x the kernel path runs cuDNN's conv2d on the
    frames folded into the batch (a view: no copy), where ATen would first copy x twice (the zero pad's
    clone and the conv's contiguous input). Only for shapes where `selftest.frame_conv_is_exact` found that
    conv2d `torch.equal` to the NCDHW conv3d on the running GPU; the bias is ATen's `add_` in both. Else the
    replaced ops run (their output copied into the frame-major layout, which the fake promises).
    """
    b, c_in, t, h, w = x.shape
    c_out = weight.shape[0]
    tensors = (x, weight) if bias is None else (x, weight, bias)
    is_frame_major = frame_major(x)
    if (is_frame_major and x.is_cuda and use_kernel("pointwise_conv3d", tensors, FLOAT_DTYPES)
            and selftest.frame_conv_is_exact(tuple(x.shape), tuple(weight.shape), x.dtype, x.device)):
        frames = x.permute(0, 2, 1, 3, 4).reshape(b * t, c_in, h, w)  # a view of frame-major memory
        y = aten.conv2d.default(frames, weight.reshape(c_out, c_in, 1, 1), bias)
        return y.view(b, t, c_out, h, w).permute(0, 2, 1, 3, 4)
    y = pointwise_conv3d_reference(x, weight, bias)
    return _empty_frame_major_output(x, weight).copy_(y) if is_frame_major else y


@pointwise_conv3d.register_fake
def _(x, weight, bias):
    if frame_major(x):
        return _empty_frame_major_output(x, weight)
    b, _, t, h, w = x.shape
    return x.new_empty((b, weight.shape[0], t, h, w))  # the reference conv's (contiguous on CPU)
