"""The Wan ops of level ``channels_last`` (exactness class ``tolerance``): the fused norm + causal conv3d with
the convolution computed by our own Triton kernel (`rewrite.kernels.conv3d.conv3d`) instead of cuDNN's.

`rms_norm_causal_conv3d_fast` takes the arguments of `rewrite::rms_norm_causal_conv3d` (`rewrite.models.wan.ops`)
and returns outputs of the same shapes and layouts (its fake is that op's). Its kernel path: a norm kernel
writes the padded channels-last conv input and the next cache (`triton_norm_fast`'s one-pass kernel for the
channel counts where it measured faster, `one_pass_norm_chosen`; else the ``lossless`` op's kernel, exactly
as that op does), then one Triton kernel convolves and adds bias, residual and the residual's deferred bias
to the fp32 accumulator before the one rounding, storing straight into the output layout (no epilogue pass).
Where `winograd.chosen` names a tile for the conv on this card (bf16/fp16, 3x3 planes; ahead of the direct conv,
whose pair and chain ops then split: `_winograd_runs_first`), the same norm kernel's padded input is convolved by
Winograd F(2x2, 3x3) or F(4x4, 3x3), as the tile says
(`rewrite.kernels.winograd`), with the weight's kept transform (`weight_store`, recomputed on a decode's first
chunk), bias, residual and its deferred bias added in fp32 before one rounding; F(4x4, 3x3)'s fp16 operands are
scaled by a bound on the norm's output computed from gamma on the device (`_norm_output_bound`).
Where `triton_conv3d.chosen` keeps cuDNN's conv but the one-pass norm is chosen for the channel count, the
op runs that norm and then the ``lossless`` op's cuDNN conv and epilogue on its padded input. Everywhere the
kernel path does not serve (a CPU tensor outside the interpreter tests, autograd, a shape or dtype
`triton_conv3d.unsupported_reason` declines and the one-pass norm does not apply, ATen's summation order not
reproduced for x where the exact norm kernel would run), the ``lossless`` op runs: the same answer as level
``lossless``, never a wrong one.

Tolerance (measured: docs/results.md, tests/models/wan/test_ops_fast.py): the conv's fp32 sum runs in another order
than cuDNN's and bias and residual are added before one rounding, so outputs differ from ``lossless`` by
about one bf16/fp16 ulp per conv (the Winograd conv: its transforms' roundings too, about 1 dB of the decode's
PSNR in issue 40's measurement); the one-pass norm computes in fp32 and rounds once (ATen rounds after each
op): about one ulp of its output; the full-decode contract is `rewrite.contract`'s (PSNR >= 45 dB and a
max-abs that grows with the video, against ``off``).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Optional

import torch
from torch import Tensor

from rewrite.ops import cache_into, run_context
from rewrite.kernels import layout
from rewrite.kernels.conv3d import conv3d as triton_conv3d
from rewrite.kernels.norm import one_pass as triton_norm_fast
from rewrite.kernels.pad import causal_pad as triton_pad
from rewrite.kernels.winograd import large_tile as winograd_large_tile
from rewrite.kernels.winograd import materialized as winograd_materialized
from rewrite.kernels.winograd import winograd
from rewrite.kernels.winograd.weight_store import transformed_4_for, transformed_for
from rewrite.models.wan import ops as _exact  # registers rewrite::rms_norm_causal_conv3d
from rewrite.models.wan.ops import ConvStage
from rewrite.ops.cache_into import writes_next_caches
from rewrite.kernels.layout import conv_output_shape
from rewrite.ops.op_info import reads_channels_last_weight

__all__ = ["chain_reason", "conv_reason", "fast_reason", "one_pass_norm_chosen", "pair_reason", "winograd_tile",
           "rms_norm_causal_conv3d_fast", "rms_norm_causal_conv3d_pair_fast", "rms_norm_causal_conv3d_pair_fast_chain"]

rewrite_ops = torch.ops.rewrite
CL = torch.channels_last_3d
logger = logging.getLogger("rewrite")


def conv_reason(in_shape, weight_shape, dtype: torch.dtype, device: Optional[torch.device] = None) -> Optional[str]:
    """None when the Triton conv serves this conv (its padded input's shape, the weight's, the dtype) and
    `triton_conv3d.chosen` says it beats cuDNN's there on `device`'s card; else why the ``lossless`` op runs it.
    Read by the pattern's guard on the graph's shapes and by the op on its tensors."""
    reason = triton_conv3d.unsupported_reason(in_shape, weight_shape, dtype)
    if reason is not None:
        return reason
    out_channels, in_channels, *kernel = weight_shape
    taps = kernel[0] * kernel[1] * kernel[2]
    width = in_shape[4] - kernel[2] + 1
    if not triton_conv3d.chosen(in_channels, out_channels, taps, width, device):
        return f"cuDNN's conv measured faster for {in_channels} -> {out_channels} channels, {taps} taps, {width} wide"
    return None


def _route(x: Tensor, cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
           residual: Optional[Tensor]) -> tuple[Optional[tuple], Optional[winograd.WinogradTile], bool]:
    """How the fast op convolves this call: the padded input's shape where the exact op's channels-last path's shape
    conditions hold (cuDNN's exactness self-check aside; else None), the Winograd tile where the table names one
    (asked first), and whether the Triton direct conv serves it otherwise (`conv_reason`)."""
    in_shape = _exact.channels_last_conv_input_shape(x, cache, pad, mode, weight, residual)
    tile = None if in_shape is None else winograd_tile(in_shape, weight.shape, x.dtype, x.device)
    served = in_shape is not None and tile is None and conv_reason(in_shape, weight.shape, x.dtype, x.device) is None
    return in_shape, tile, served


def winograd_tile(in_shape, weight_shape, dtype: torch.dtype,
                  device: Optional[torch.device] = None) -> Optional[winograd.WinogradTile]:
    """The tile with which the Winograd kernel serves this conv (its padded input's shape, the weight's, the dtype)
    where `winograd.chosen` measured it faster than both other convs on `device`'s card; else None."""
    if device is None or winograd.unsupported_reason(in_shape, weight_shape, dtype) is not None:
        return None
    out_channels, in_channels, _, _, kernel_width = weight_shape
    tile = winograd.chosen(in_channels, out_channels, in_shape[4] - kernel_width + 1, dtype, device)
    if tile is not None and tile.materialized and winograd_materialized.unsupported_reason(in_channels, out_channels):
        return None
    return tile


def _winograd_runs_first(in_shape, weight_shape, dtype: torch.dtype, device: Optional[torch.device]) -> bool:
    """The Winograd table names this conv at a plain width: the Winograd conv runs it, ahead of the direct conv (the
    table's entries were measured faster than both other convs, with the norm kernel before them and no fused norm
    epilogue after). A symbolic width (a pattern's guard) answers False: the ops decide on their tensors."""
    return isinstance(in_shape[4], int) and winograd_tile(in_shape, weight_shape, dtype, device) is not None


def fast_reason(in_shape, weight_shape, dtype: torch.dtype, device: Optional[torch.device] = None) -> Optional[str]:
    """None when the fast op's kernel path serves this conv: the Triton conv (`conv_reason`), the Winograd conv
    (`winograd_tile`) or, where cuDNN's conv stays, the one-pass norm before it (a channel count in
    `_ONE_PASS_BEFORE_CUDNN_CHANNELS`, bf16/fp16); else why the ``lossless`` op runs it. Read by the pattern's
    guard on the graph's shapes."""
    reason = conv_reason(in_shape, weight_shape, dtype, device)
    if reason is None or winograd_tile(in_shape, weight_shape, dtype, device) is not None:
        return None
    if dtype in triton_conv3d.SUPPORTED_DTYPES and in_shape[1] in _ONE_PASS_BEFORE_CUDNN_CHANNELS \
            and in_shape[1] <= triton_norm_fast.MAX_CHANNELS:
        return None
    return f"{reason}; the one-pass norm is not chosen for {in_shape[1]} channels"


def one_pass_norm_chosen(x: Tensor) -> bool:
    """Whether the conv's input norm runs `triton_norm_fast`'s one-pass kernel (its channel count measured
    faster than the exact two-pass kernel, `_ONE_PASS_NORM_CHANNELS`, and the kernel serves x)."""
    return x.shape[1] in _ONE_PASS_NORM_CHANNELS and triton_norm_fast.one_pass_reason(x) is None


# Channel counts whose one-pass norm (into the padded conv input) measured faster on the H200 than the exact
# two-pass kernel at every Wan shape swept (docs/tuning.md section 1.8), and Wan 2.2's encoder widths 160, 320 and
# 640 (the 704p encode faster with them on the H100, within the contract: tuning.md 1.24). Not Wan 2.2's 1024:
# faster alone, but the 720p decode did not move while its error against `off` grew (tuning.md 1.14).
_ONE_PASS_NORM_CHANNELS = frozenset({96, 160, 192, 256, 320, 384, 512, 640})
# Of those, the counts whose one-pass norm also runs before a conv cuDNN keeps (the op then runs the lossless
# op's conv on its padded input): Wan 2.2's 256 and 512, and its encoder's 160, 320 and 640 (where cuDNN keeps
# every conv of the 704p encode). Not Wan 2.1's 96 (`conv_out`) and 192 / 384 (its
# 90x160 level, 480p's 416 and 208 wide levels): with them one-pass, Wan 2.1 720p's max-abs against `off` went
# past the level's bound of the time, 6e-2, for a few milliseconds (docs/tuning.md section 5, "Notes moved from the
# runners");
# their norms keep the exact kernel, the lossless op's numbers.
_ONE_PASS_BEFORE_CUDNN_CHANNELS = frozenset({160, 256, 320, 512, 640})


def _triton_conv(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor], out: Tensor,
                 residual_bias: Optional[Tensor]) -> Tensor:
    """The fast ops' conv of a padded channels-last input into `out`: `triton_conv3d.conv3d_channels_last`, or for
    a narrow conv (Wan's 96 -> 3 head) its folded form where `triton_conv3d.folded_taps` measured it faster."""
    weight = weight.contiguous(memory_format=CL)
    out_channels, in_channels, *kernel = weight.shape
    fold = triton_conv3d.folded_taps(in_channels, out_channels, math.prod(kernel))
    if fold:
        return triton_conv3d.conv3d_channels_last_folded(padded, weight, bias, residual, out, residual_bias, fold=fold)
    return triton_conv3d.conv3d_channels_last(padded, weight, bias, residual, out, residual_bias)


def _winograd_conv(padded: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor], out: Tensor,
                   residual_bias: Optional[Tensor], tile: winograd.WinogradTile, refresh: bool,
                   norm: tuple[Tensor, float, float]) -> Tensor:
    """The fast ops' Winograd conv of a padded channels-last input into `out`, with what `weight_store` keeps for
    the weight (`refresh`: recomputed from the weight, on a decode's first chunk): F(2x2, 3x3)'s transformed weight
    (`transformed_for`), or F(4x4, 3x3)'s point scales with the points computed in the call (`transformed_4_for`:
    the points kept took the decode's peak over `off`'s). The residual's deferred bias joins the conv's bias in fp32
    (the kernel adds the bias in fp32 before its one rounding). `norm`: the (gamma, scale, bias) of the norm that
    wrote `padded`; the F(4x4, 3x3) form scales its fp16 operands by the bound on that norm's output
    (`_norm_output_bound`, a device scalar), F(2x2, 3x3) does not need it. Notes its route (`run_context.note_route`): a capture lists it in ``report()``, Winograd's error class
    being another than the direct convs'."""
    if residual_bias is not None:
        bias = residual_bias.float() if bias is None else bias.float() + residual_bias.float()
    frames_by_plane, dtype = "x".join(map(str, out.shape[2:])), str(out.dtype).removeprefix("torch.")
    run_context.note_route(f"Winograd F({tile.output_block}x{tile.output_block}, 3x3): {weight.shape[1]} -> "
                           f"{weight.shape[0]} channels at {frames_by_plane}, {dtype}")
    if tile.output_block == 4:
        u, point_scales = transformed_4_for(weight, refresh)
        return winograd_large_tile.large_tile_conv3d(padded, u, point_scales, _norm_output_bound(*norm), bias,
                                                     residual, out, tile)
    return winograd.winograd_conv3d_channels_last(padded, transformed_for(weight, refresh), bias, residual, out, tile)


def _norm_output_bound(gamma: Tensor, scale: float, norm_bias: float) -> Tensor:
    """A device scalar at least the largest magnitude the norm (+ SiLU) can write into the conv's padded input:
    a normalized vector has entries of at most 1, so ``scale x max |gamma| + |bias|`` (SiLU shrinks magnitudes; the
    cached frames are the same norm's output, the padding zeros). No pass over the activation, no host sync."""
    return gamma.detach().abs().amax().float() * abs(scale) + abs(norm_bias)


def _conv_output(padded: Tensor, weight: Tensor, residual: Optional[Tensor], channels_last_out: bool) -> Tensor:
    """The fast ops' conv output: channels-last where `channels_last_out`, else in the layout
    `layout.conv_output_strides` gives next to the residual."""
    shape = conv_output_shape(padded.shape, weight.shape)
    if channels_last_out:
        return torch.empty(shape, dtype=padded.dtype, device=padded.device, memory_format=CL)
    return torch.empty_strided(shape, layout.conv_output_strides(shape, residual), dtype=padded.dtype,
                               device=padded.device)


def _normalized_input(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, x_bias, into=None):
    """(the conv's padded channels-last input, the next cache) from the norm (+ SiLU) of x: the one-pass
    kernel where `one_pass_norm_chosen`, else the exact op's kernel where it reproduces ATen's order
    (`fused_norm_plan`); None where neither serves (the caller runs the ``lossless`` op). `into`: a buffer
    for the next cache (`cache_into.buffer_for` decides whether it is written there)."""
    cache_read = cache if mode != "chunk0" else None
    next_cache = cache_into.buffer_for(into, cache_read, x)
    if one_pass_norm_chosen(x):
        return triton_norm_fast.rms_norm_padded_one_pass(x, gamma, scale, norm_bias, eps, act == "silu", cache_read,
                                                         pad, x_bias, next_cache)
    plan = _exact.fused_norm_plan(x, upcast, act, x_bias)
    if plan is None:
        return None
    return _exact.norm_into_padded_input(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, plan, x_bias,
                                         next_cache)


@writes_next_caches({1: "cache"})
@reads_channels_last_weight("weight")
@torch.library.custom_op("rewrite::rms_norm_causal_conv3d_fast", mutates_args=())
def rms_norm_causal_conv3d_fast(x: Tensor, gamma: Tensor, scale: float, norm_bias: float, eps: float, upcast: bool,
                                act: Optional[str], cache: Optional[Tensor], pad: list[int], mode: str,
                                weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor],
                                x_bias: Optional[Tensor] = None, residual_bias: Optional[Tensor] = None,
                                channels_last_out: bool = False) -> tuple[Tensor, Tensor]:
    """`rewrite::rms_norm_causal_conv3d` with the Triton conv and its fused epilogue, or cuDNN's conv after the
    one-pass norm (module docstring); its norm kernels write the next cache into a buffer `cache_into` gives."""
    into = cache_into.taken().get(1)
    args = (x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias, residual, x_bias,
            residual_bias, channels_last_out)
    if channels_last_out and (bias is not None or residual is not None):
        raise ValueError("rms_norm_causal_conv3d_fast: channels_last_out is for the raw conv output (no bias, "
                         "no residual)")
    tensors = tuple(t for t in (x, gamma, cache, weight, bias, residual, x_bias, residual_bias) if t is not None)
    if not _exact.fused_norm_applies(x, gamma, act, "rms_norm_causal_conv3d_fast", tensors,
                                     triton_conv3d.SUPPORTED_DTYPES):
        return rewrite_ops.rms_norm_causal_conv3d.default(*args)
    in_shape, tile, served = _route(x, cache, pad, mode, weight, residual)
    if tile is not None:
        normalized = _normalized_input(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, x_bias, into)
        if normalized is not None:
            padded, next_cache = normalized
            out = _conv_output(padded, weight, residual, channels_last_out)
            _winograd_conv(padded, weight, bias, residual, out, residual_bias, tile, mode == "chunk0",
                           (gamma, scale, norm_bias))
            return out, next_cache
        _log_no_norm_kernel("Winograd", tuple(x.shape), x.stride(), x.dtype, tuple(weight.shape[:2]))
    if (not served and one_pass_norm_chosen(x) and x.shape[1] in _ONE_PASS_BEFORE_CUDNN_CHANNELS
            and in_shape is not None):
        # cuDNN's conv stays; its input comes from the one-pass norm
        padded, next_cache = _normalized_input(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, x_bias,
                                               into)
        if channels_last_out:  # cuDNN's output of channels-last operands is channels-last already
            return _exact.channels_last_conv_raw(padded, weight).contiguous(memory_format=CL), next_cache
        return _exact.channels_last_conv(padded, weight, bias, residual, residual_bias), next_cache
    if served:
        normalized = _normalized_input(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, x_bias, into)
        if normalized is not None:
            padded, next_cache = normalized
            out = _conv_output(padded, weight, residual, channels_last_out)
            _triton_conv(padded, weight, bias, residual, out, residual_bias)
            return out, next_cache
        _log_no_norm_kernel("Triton", tuple(x.shape), x.stride(), x.dtype, tuple(weight.shape[:2]))
    return rewrite_ops.rms_norm_causal_conv3d.default(*args)


@functools.lru_cache(maxsize=256)
def _log_no_norm_kernel(conv: str, shape: tuple, strides: tuple, dtype: torch.dtype, channels: tuple) -> None:
    """Says once per conv kernel ("Triton" or "Winograd"), input shape, layout and conv that the kernel was chosen
    but the op ran the ``lossless`` op: it convolves only an input its norm kernel wrote, and neither norm kernel
    served x (the one-pass one not chosen for its channel count, the exact one without a plan of ATen's order,
    e.g. for a channels-last x). A speed loss, never a wrong answer."""
    logger.info("rms_norm_causal_conv3d_fast: the %s conv is chosen for %d -> %d channels, but no norm kernel "
                "serves x %s (strides %s, %s): the lossless op runs the norm and the conv", conv, channels[1],
                channels[0], list(shape), list(strides), dtype)


@rms_norm_causal_conv3d_fast.register_fake
def _(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias, residual, x_bias=None,
      residual_bias=None, channels_last_out=False):
    return _exact._rms_norm_causal_conv3d_fake(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight,
                                               bias, residual, x_bias, residual_bias, channels_last_out)


# ---- two chained convs, the second's norm in the first's epilogue -------------------------------------------
def pair_reason(first_out_channels: int, first_in_channels: int, second_in_shape, second_weight_shape,
                dtype: torch.dtype, act: Optional[str], device: Optional[torch.device] = None) -> Optional[str]:
    """None when the first conv's kernel may normalize its output straight into the second conv's padded
    input (one program holds all its output channels, `triton_conv3d.norm_epilogue_chosen` measured it
    faster, the second conv is served too: `conv_reason`); else why the pair runs as two
    `rms_norm_causal_conv3d_fast` ops."""
    if act not in ("silu", None):
        return f"activation {act!r} after the second norm (SiLU or none is fused)"
    tile = triton_conv3d.norm_launch_config(first_in_channels, first_out_channels)
    reason = triton_conv3d.norm_epilogue_reason(first_out_channels, tile)
    if reason is None and not triton_conv3d.norm_epilogue_chosen(first_in_channels, first_out_channels):
        reason = (f"the fused norm epilogue measured slower than the conv plus the norm kernel for "
                  f"{first_in_channels} -> {first_out_channels} channels")
    reason = reason if reason is not None else conv_reason(second_in_shape, second_weight_shape, dtype, device)
    if reason is None and _winograd_runs_first(second_in_shape, second_weight_shape, dtype, device):
        reason = "the second conv is the Winograd table's (`winograd_tile`): the pair runs as two ops"
    return reason


def _first_op_args(x: Tensor, first: ConvStage) -> tuple:
    """`rms_norm_causal_conv3d_fast`'s arguments for the first conv: no bias (deferred into the second norm),
    no residual, its output channels-last."""
    return (x, *first[:-1], None, None, None, None, True)


def _second_op_args(y: Tensor, second: ConvStage, residual: Optional[Tensor], x_bias: Optional[Tensor],
                    residual_bias: Optional[Tensor]) -> tuple:
    """`rms_norm_causal_conv3d_fast`'s arguments for the second conv: the first conv's output `y` whose bias
    `x_bias` the norm adds as it reads, the residual with its own deferred bias."""
    return (y, *second, residual, x_bias, residual_bias, False)


def _pair_kernel_inputs(x: Tensor, first: ConvStage, second: ConvStage, residual: Optional[Tensor], tensors,
                        normalized: Optional[Tensor] = None) -> Optional[Tensor]:
    """A tensor of the first conv's output shape (for the shape checks) where the pair op's kernel path serves
    the call (the first op's fused-norm conditions, both convs served, `pair_reason`); else None: the two ops
    run. `normalized`: the first conv's padded input made by the op before (then x's norm is not run)."""
    weight = first.weight
    if not (_exact.fused_norm_applies(x, first.gamma, first.act, "rms_norm_causal_conv3d_pair_fast", tensors,
                                      triton_conv3d.SUPPORTED_DTYPES) and second.gamma.numel() == weight.shape[0]):
        return None
    if normalized is not None:
        in_shape = tuple(normalized.shape) if normalized.is_contiguous(memory_format=CL) else None
    else:
        in_shape = _exact.channels_last_conv_input_shape(x, first.cache, first.pad, first.mode, weight, None)
    if (in_shape is None or conv_reason(in_shape, weight.shape, x.dtype, x.device) is not None
            or _winograd_runs_first(in_shape, weight.shape, x.dtype, x.device)):
        return None
    y_proxy = torch.empty((), dtype=x.dtype, device=x.device).expand(conv_output_shape(in_shape, weight.shape))
    in_shape2 = _exact.channels_last_conv_input_shape(y_proxy, second.cache, second.pad, second.mode, second.weight,
                                                      residual)
    if in_shape2 is None or pair_reason(weight.shape[0], weight.shape[1], in_shape2, second.weight.shape, x.dtype,
                                        second.act, x.device) is not None:
        return None
    if (normalized is None and not one_pass_norm_chosen(x)
            and _exact.fused_norm_plan(x, first.upcast, first.act, None) is None):
        return None
    return y_proxy


def _first_conv_of_normalized(normalized: Tensor, weight: Tensor, first: ConvStage) -> Tensor:
    """The chain op's first conv, without bias, of the padded input the op before normalized, channels-last: by the
    Winograd conv where its table names the conv, else by ATen's (cuDNN's) conv."""
    tile = None
    if normalized.is_contiguous(memory_format=CL):
        tile = winograd_tile(tuple(normalized.shape), weight.shape, normalized.dtype, normalized.device)
    if tile is None:
        return _exact.channels_last_conv_raw(normalized, weight).contiguous(memory_format=CL)
    out = _conv_output(normalized, weight, None, True)
    return _winograd_conv(normalized, weight, None, None, out, None, tile, first.mode == "chunk0",
                          (first.gamma, first.scale, first.norm_bias))


def _first_conv_into_second_input(padded: Tensor, y_proxy: Tensor, weight: Tensor, bias: Optional[Tensor],
                                  second: ConvStage, into2: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The pair's kernel path up to its second conv: (the second conv's padded input, its next cache), the
    first conv of `padded` normalized straight into them (`triton_conv3d.conv3d_channels_last_norm_padded`;
    the pad kernel writes the cache frames and the zero pad). `y_proxy`: a tensor of the first conv's
    output shape (`_pair_kernel_inputs`); `into2`: a buffer for the second next cache (`cache_into`)."""
    cache2_read = second.cache if second.mode != "chunk0" else None
    padded2, next_cache2 = triton_pad.causal_pad_rest_channels_last(
        y_proxy, cache2_read, second.pad, cache_into.buffer_for(into2, cache2_read, y_proxy))
    triton_conv3d.conv3d_channels_last_norm_padded(
        padded, weight.contiguous(memory_format=CL), bias, second.gamma, second.scale, second.norm_bias, second.eps,
        second.act == "silu", padded2, next_cache2, second.pad, 0 if cache2_read is None else cache2_read.shape[2])
    return padded2, next_cache2


@writes_next_caches({1: "cache", 2: "cache2"})
@reads_channels_last_weight("weight", "weight2")
@torch.library.custom_op("rewrite::rms_norm_causal_conv3d_pair_fast", mutates_args=())
def rms_norm_causal_conv3d_pair_fast(x: Tensor, gamma: Tensor, scale: float, norm_bias: float, eps: float,
                                     upcast: bool, act: Optional[str], cache: Optional[Tensor], pad: list[int],
                                     mode: str, weight: Tensor, bias: Optional[Tensor], gamma2: Tensor, scale2: float,
                                     norm_bias2: float, eps2: float, upcast2: bool, act2: Optional[str],
                                     cache2: Optional[Tensor], pad2: list[int], mode2: str, weight2: Tensor,
                                     bias2: Optional[Tensor], residual: Optional[Tensor],
                                     residual_bias: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """A residual block's two convs, (output, first next cache, second next cache) of::

        y, next_cache = rms_norm_causal_conv3d_fast(x, gamma, ..., cache, pad, mode, weight, channels_last_out=True)
        out, next_cache2 = rms_norm_causal_conv3d_fast(y, gamma2, ..., cache2, pad2, mode2, weight2, bias2,
                                                       residual, x_bias=bias, residual_bias=residual_bias)

    Kernel path: the first conv's program holds all its output channels, so its epilogue adds the bias,
    rounds once, takes the second norm over the channels (+ SiLU) and stores the result straight into the
    second conv's padded channels-last input and next cache (`triton_conv3d.conv3d_channels_last_norm_padded`;
    the pad kernel writes the cache frames and the zero pad): y is never written or read back. Where the
    kernel path does not serve (`pair_reason`, or the first op's conditions), the two ops above run.
    Tolerance: the two fused ops' (their convs' sum order, one rounding of conv + bias), and the second norm
    computed in fp32 from the first conv's rounded output with one rounding at the end (ATen rounds after
    each op; `upcast2` is then moot). The kernel path writes the next caches into buffers `cache_into` gives."""
    into = cache_into.taken()
    first = ConvStage(gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias)
    second = ConvStage(gamma2, scale2, norm_bias2, eps2, upcast2, act2, cache2, pad2, mode2, weight2, bias2)
    if residual_bias is not None and residual is None:
        raise ValueError("rms_norm_causal_conv3d_pair_fast: residual_bias without a residual")
    tensors = tuple(t for t in (x, gamma, cache, weight, bias, gamma2, cache2, weight2, bias2, residual, residual_bias)
                    if t is not None)
    served = _pair_kernel_inputs(x, first, second, residual, tensors)
    if served is not None:
        padded, next_cache = _normalized_input(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, None,
                                               into.get(1))
        padded2, next_cache2 = _first_conv_into_second_input(padded, served, weight, bias, second, into.get(2))
        del padded  # the first conv's input: free before the second conv's output is allocated
        shape = conv_output_shape(padded2.shape, weight2.shape)
        out = torch.empty_strided(shape, layout.conv_output_strides(shape, residual), dtype=x.dtype, device=x.device)
        _triton_conv(padded2, weight2, bias2, residual, out, residual_bias)
        return out, next_cache, next_cache2
    y, next_cache = rewrite_ops.rms_norm_causal_conv3d_fast.default(*_first_op_args(x, first))
    out, next_cache2 = rewrite_ops.rms_norm_causal_conv3d_fast.default(
        *_second_op_args(y, second, residual, bias, residual_bias))
    return out, next_cache, next_cache2


@rms_norm_causal_conv3d_pair_fast.register_fake
def _(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias, gamma2, scale2, norm_bias2, eps2,
      upcast2, act2, cache2, pad2, mode2, weight2, bias2, residual, residual_bias):
    first = ConvStage(gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias)
    second = ConvStage(gamma2, scale2, norm_bias2, eps2, upcast2, act2, cache2, pad2, mode2, weight2, bias2)
    y, next_cache = _exact._rms_norm_causal_conv3d_fake(*_first_op_args(x, first))
    out, next_cache2 = _exact._rms_norm_causal_conv3d_fake(*_second_op_args(y, second, residual, bias, residual_bias))
    return out, next_cache, next_cache2


# ---- a residual block whose second conv also normalizes its output for the next block ----------------------
# (in channels, out channels) of the second convs of residual blocks (bias, residual) whose fused norm epilogue
# (the block output stored, and normalized into the next block's padded input) measured faster on the H200 than
# the conv plus the one-pass norm kernel (docs/tuning.md 1.9): 96 -> 96 4.54 against 4.58 ms @ 4x720x1280,
# 1.99 against 2.05-2.08 @ 4x480x832. 192 -> 192 measured slower (3.62-3.72 against 3.62-3.64 @ 4x360x640,
# 1.93-1.94 against 1.89-1.91 @ 4x240x416): ptxas spills 256 bytes a thread at the 128-register cap.
_RESIDUAL_NORM_EPILOGUE_FASTER: frozenset = frozenset({(96, 96)})


def chain_reason(in_channels: int, out_channels: int, dtype: torch.dtype, act: Optional[str]) -> Optional[str]:
    """None when a block's second conv (`in_channels` -> `out_channels`, with bias and residual) may store its
    output and normalize it (+ `act`) into the next block's padded input in one epilogue (one program holds
    every output channel, measured faster: `_RESIDUAL_NORM_EPILOGUE_FASTER`); else why not. Read by the
    `chain_block_norms` pass on the graph's shapes and by the op on its tensors."""
    if dtype not in triton_conv3d.SUPPORTED_DTYPES:
        return f"dtype {dtype} (the Triton conv serves {triton_conv3d.SUPPORTED_DTYPES})"
    if act not in ("silu", None):
        return f"activation {act!r} after the next norm (SiLU or none is fused)"
    tile = triton_conv3d.norm_launch_config(in_channels, out_channels)
    reason = triton_conv3d.norm_epilogue_reason(out_channels, tile)
    if reason is None and (in_channels, out_channels) not in _RESIDUAL_NORM_EPILOGUE_FASTER:
        reason = (f"the residual conv's norm epilogue is not measured faster for {in_channels} -> {out_channels} "
                  f"channels")
    return reason


def _absent(x: Tensor) -> Tensor:
    """The placeholder of an output the call does not make (0 elements, x's dtype and device)."""
    return x.new_empty((0,))


def _next_input(y: Tensor, gamma: Tensor, scale: float, norm_bias: float, eps: float, upcast: bool,
                act: Optional[str], cache: Optional[Tensor], pad: list[int], mode: str,
                kernels: bool, into: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(the next causal conv's padded channels-last input, its next cache, channels-last) from the norm (+ act)
    of y: the kernels of `_normalized_input` where `kernels` and they serve (the next cache into `into`
    where `cache_into.buffer_for` allows), else the reference ops."""
    if kernels:
        normalized = _normalized_input(y, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, None, into)
        if normalized is not None:
            return normalized
    from rewrite.models.wan.reference import causal_conv_input_reference, rms_norm_reference

    v = rms_norm_reference(y, gamma, scale, norm_bias, eps, upcast, act)
    padded, next_cache = causal_conv_input_reference(v, cache if mode != "chunk0" else None, pad, mode)
    return padded.contiguous(memory_format=CL), next_cache.contiguous(memory_format=CL)


def _chain_fake_next(out: Tensor, gamma3: Optional[Tensor], cache3: Optional[Tensor], pad3: list[int],
                     mode3: str) -> tuple[Tensor, Tensor]:
    if gamma3 is None:
        return _absent(out), _absent(out)
    b, c, _, h, w = out.shape
    padded = layout.empty(layout.padded_shape(out.shape, cache3, pad3, mode3), out, CL)
    return padded, layout.empty((b, c, 2, h, w), out, CL)


@writes_next_caches({1: "cache", 2: "cache2", 4: "cache3"})
@reads_channels_last_weight("weight", "weight2")
@torch.library.custom_op("rewrite::rms_norm_causal_conv3d_pair_fast_chain", mutates_args=())
def rms_norm_causal_conv3d_pair_fast_chain(
        x: Tensor, normalized: Optional[Tensor], gamma: Tensor, scale: float, norm_bias: float, eps: float,
        upcast: bool, act: Optional[str], cache: Optional[Tensor], pad: list[int], mode: str, weight: Tensor,
        bias: Optional[Tensor], gamma2: Tensor, scale2: float, norm_bias2: float, eps2: float, upcast2: bool,
        act2: Optional[str], cache2: Optional[Tensor], pad2: list[int], mode2: str, weight2: Tensor,
        bias2: Optional[Tensor], residual: Optional[Tensor], residual_bias: Optional[Tensor],
        gamma3: Optional[Tensor], scale3: float, norm_bias3: float, eps3: float, upcast3: bool, act3: Optional[str],
        cache3: Optional[Tensor], pad3: list[int], mode3: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`rms_norm_causal_conv3d_pair_fast` linked to the blocks around it: (output, first next cache, second
    next cache, next block's padded input, next block's next cache).

    * `normalized` None: the first norm runs here on x (with `cache`), as in the pair op. Given: it is the first
      conv's padded channels-last input, normalized from x by the op before (its fourth output; x is still
      passed for the shapes and the fallback), and this op's first next cache is empty (the op before returned
      it as its fifth output).
    * `gamma3` given: the output y is also normalized, ``rms_norm(y, gamma3, scale3, norm_bias3, eps3)``
      (+ `act3`), into the next causal conv's padded channels-last input (`cache3` frames, `pad3`, `mode3`) and
      next cache: the fourth and fifth outputs. Kernel path: the second conv's epilogue stores y and the
      normalized y in one pass (`triton_conv3d.conv3d_channels_last_norm_padded` with the residual;
      `chain_reason`). None: the fourth and fifth outputs are empty.

    Where a part's kernel path does not serve, it runs as the pair op (or the first conv by ATen on
    `normalized`, then `rms_norm_causal_conv3d_fast`) and the next input by `_next_input`.
    Tolerance: the pair op's, plus the next norm in fp32 from the rounded y with one rounding (the
    ``channels_last`` contract); the same values as the unlinked ops up to those roundings. The kernel paths
    write the next caches into buffers `cache_into` gives."""
    into = cache_into.taken()
    if residual_bias is not None and residual is None:
        raise ValueError("rms_norm_causal_conv3d_pair_fast_chain: residual_bias without a residual")
    tensors = tuple(t for t in (x, normalized, gamma, cache, weight, bias, gamma2, cache2, weight2, bias2, residual,
                                residual_bias, gamma3, cache3) if t is not None)
    first = ConvStage(gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias)
    second = ConvStage(gamma2, scale2, norm_bias2, eps2, upcast2, act2, cache2, pad2, mode2, weight2, bias2)
    served = _pair_kernel_inputs(x, first, second, residual, tensors, normalized)
    if served is None:
        if normalized is None:
            out, next_cache, next_cache2 = rewrite_ops.rms_norm_causal_conv3d_pair_fast.default(
                x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias, gamma2, scale2,
                norm_bias2, eps2, upcast2, act2, cache2, pad2, mode2, weight2, bias2, residual, residual_bias)
        else:
            y = _first_conv_of_normalized(normalized, weight, first)
            out, next_cache2 = rewrite_ops.rms_norm_causal_conv3d_fast.default(
                *_second_op_args(y, second, residual, bias, residual_bias))
            next_cache = _absent(x)
        if gamma3 is None:
            return out, next_cache, next_cache2, _absent(x), _absent(x)
        kernels = _exact.fused_norm_applies(out, gamma3, act3, "rms_norm_causal_conv3d_pair_fast_chain", tensors,
                                            triton_conv3d.SUPPORTED_DTYPES)
        return (out, next_cache, next_cache2,
                *_next_input(out, gamma3, scale3, norm_bias3, eps3, upcast3, act3, cache3, pad3, mode3, kernels,
                             into.get(4)))
    if normalized is None:
        padded, next_cache = _normalized_input(x, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, None,
                                               into.get(1))
    else:
        padded, next_cache = normalized, _absent(x)
    padded2, next_cache2 = _first_conv_into_second_input(padded, served, weight, bias, second, into.get(2))
    del padded
    shape = conv_output_shape(padded2.shape, weight2.shape)
    out = torch.empty_strided(shape, layout.conv_output_strides(shape, residual), dtype=x.dtype, device=x.device)
    weight2_cl = weight2.contiguous(memory_format=CL)
    if gamma3 is None:
        _triton_conv(padded2, weight2_cl, bias2, residual, out, residual_bias)
        return out, next_cache, next_cache2, _absent(x), _absent(x)
    cache3_read = cache3 if mode3 != "chunk0" else None
    if (chain_reason(weight2.shape[1], weight2.shape[0], x.dtype, act3) is None and gamma3.numel() == shape[1]
            and triton_conv3d.row_view_reason(out) is None
            and (residual is None or triton_conv3d.row_view_reason(residual) is None)):
        padded3, next_cache3 = triton_pad.causal_pad_rest_channels_last(
            out, cache3_read, pad3, cache_into.buffer_for(into.get(4), cache3_read, out))
        triton_conv3d.conv3d_channels_last_norm_padded(
            padded2, weight2_cl, bias2, gamma3, scale3, norm_bias3, eps3, act3 == "silu", padded3, next_cache3, pad3,
            0 if cache3_read is None else cache3_read.shape[2], residual=residual, residual_bias=residual_bias,
            out=out)
        return out, next_cache, next_cache2, padded3, next_cache3
    _triton_conv(padded2, weight2_cl, bias2, residual, out, residual_bias)
    del padded2
    return (out, next_cache, next_cache2,
            *_next_input(out, gamma3, scale3, norm_bias3, eps3, upcast3, act3, cache3, pad3, mode3, True,
                         into.get(4)))


@rms_norm_causal_conv3d_pair_fast_chain.register_fake
def _(x, normalized, gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias, gamma2, scale2,
      norm_bias2, eps2, upcast2, act2, cache2, pad2, mode2, weight2, bias2, residual, residual_bias, gamma3, scale3,
      norm_bias3, eps3, upcast3, act3, cache3, pad3, mode3):
    second = ConvStage(gamma2, scale2, norm_bias2, eps2, upcast2, act2, cache2, pad2, mode2, weight2, bias2)
    if normalized is None:
        first = ConvStage(gamma, scale, norm_bias, eps, upcast, act, cache, pad, mode, weight, bias)
        y, next_cache = _exact._rms_norm_causal_conv3d_fake(*_first_op_args(x, first))
    else:
        y = layout.empty(conv_output_shape(normalized.shape, weight.shape), x, CL)
        next_cache = _absent(x)
    out, next_cache2 = _exact._rms_norm_causal_conv3d_fake(*_second_op_args(y, second, residual, bias, residual_bias))
    return (out, next_cache, next_cache2, *_chain_fake_next(out, gamma3, cache3, pad3, mode3))
