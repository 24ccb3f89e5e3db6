"""Exhaustive self-tests that decide, per device and dtype, whether a fused formula may replace ATen's.

`silu_is_exact(device, dtype)`: the norm kernel folds SiLU into its epilogue only where the kernel's SiLU
is bit-identical to `F.silu` on the running device: for bf16 and fp16 over all 65,536 bit patterns, for
fp32 over 2**24 patterns spread over the whole range plus the special values (fp32 has too many to
enumerate on every start; the formula and libdevice `expf` are the ones ATen's CUDA kernel uses). The
result is cached per (device, dtype); it is never computed during a CUDA graph capture (the fused SiLU is
then simply not used).

`channels_last_conv_is_exact(input_shape, weight_shape, dtype, device, padding)`: cuDNN's conv3d/conv2d on
channels-last (NDHWC/NHWC) input and weight is used in place of the NCDHW/NCHW conv only for shapes where, on the running device
and cuDNN settings, both give `torch.equal` outputs on seeded random data (a different cuDNN kernel choice
for the other layout would show up as differing low bits). Checked once per shape outside CUDA graph
captures (inside one, the NCDHW conv is used), cached per process.

`frame_conv_is_exact(input_shape, weight_shape, dtype, device)`: likewise for a 1x1x1 conv3d of a frame-major
input run as cuDNN's conv2d over the frames folded into the batch (`rewrite::pointwise_conv3d`), against the
conv3d of the NCDHW input that ATen runs.
"""

from __future__ import annotations

import torch

from rewrite.ops import triton_norm

_RESULTS: dict[tuple[str, torch.dtype], bool] = {}
_CONV_RESULTS: dict[tuple, bool] = {}
_FRAME_CONV_RESULTS: dict[tuple, bool] = {}


def _bit_patterns(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if dtype in (torch.bfloat16, torch.float16):
        return torch.arange(-(2**15), 2**15, dtype=torch.int32, device=device).to(torch.int16).view(dtype)
    step = 2**8  # every 256th fp32 bit pattern: 2**24 values across signs, exponents and mantissas
    bits = torch.arange(-(2**31), 2**31 - 1, step, dtype=torch.int64, device=device).to(torch.int32)
    return bits.view(torch.float32)


def silu_check(device: torch.device, dtype: torch.dtype) -> tuple[bool, int, int]:
    """(identical, mismatches, values tested): the kernel's SiLU against `F.silu`, compared as bits."""
    x = _bit_patterns(dtype, device)
    ours = triton_norm.silu(x)
    theirs = torch.nn.functional.silu(x)
    int_type = {2: torch.int16, 4: torch.int32}[x.element_size()]
    # NaNs may differ in payload only; any NaN equals any NaN here
    same = (ours.view(int_type) == theirs.view(int_type)) | (ours.isnan() & theirs.isnan())
    mismatches = int((~same).sum())
    return mismatches == 0, mismatches, x.numel()


def silu_is_exact(device: torch.device, dtype: torch.dtype) -> bool:
    if device.type != "cuda":
        return False
    key = (str(device), dtype)
    if key not in _RESULTS:
        if torch.cuda.is_current_stream_capturing():
            return False
        _RESULTS[key] = silu_check(device, dtype)[0]
    return _RESULTS[key]


def _conv_settings() -> tuple:
    cudnn = torch.backends.cudnn
    return cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32


def _seeded_conv_operands(input_shape: tuple[int, ...], weight_shape: tuple[int, ...], dtype: torch.dtype,
                          device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, weight): seeded random contiguous operands of a conv check, the weight scaled by 1/sqrt(fan in)."""
    generator = torch.Generator(device=device).manual_seed(0)
    fan_in = 1
    for size in weight_shape[1:]:
        fan_in *= size
    weight = torch.randn(weight_shape, generator=generator, device=device, dtype=torch.float32).mul_(fan_in ** -0.5)
    weight = weight.to(dtype)
    return torch.randn(input_shape, generator=generator, device=device, dtype=dtype), weight


def channels_last_conv_check(input_shape: tuple[int, ...], weight_shape: tuple[int, ...], dtype: torch.dtype,
                             device: torch.device, padding: tuple[int, ...] = (0, 0, 0)) -> bool:
    """Whether conv2d/conv3d (by the weight's rank; stride 1, `padding`) of seeded random contiguous operands
    equals the same conv of the same values in channels-last memory (no bias)."""
    conv = torch.nn.functional.conv3d if len(weight_shape) == 5 else torch.nn.functional.conv2d
    memory_format = torch.channels_last_3d if len(weight_shape) == 5 else torch.channels_last
    x, weight = _seeded_conv_operands(input_shape, weight_shape, dtype, device)
    expected = conv(x, weight, None, 1, list(padding))
    x = x.contiguous(memory_format=memory_format)  # the contiguous copy is freed here
    actual = conv(x, weight.contiguous(memory_format=memory_format), None, 1, list(padding))
    return torch.equal(actual, expected)


def channels_last_conv_is_exact(input_shape: tuple[int, ...], weight_shape: tuple[int, ...], dtype: torch.dtype,
                                device: torch.device, padding: tuple[int, ...] = (0, 0, 0)) -> bool:
    key = (tuple(input_shape), tuple(weight_shape), tuple(padding), dtype, str(device), _conv_settings())
    return _cached_conv_check(_CONV_RESULTS, device, key, lambda: channels_last_conv_check(
        tuple(input_shape), tuple(weight_shape), dtype, device, tuple(padding)))


def _cached_conv_check(results: dict[tuple, bool], device: torch.device, key: tuple, check) -> bool:
    """`check()`'s verdict, computed once per key (no_grad); False off CUDA, and without caching during a CUDA
    graph capture."""
    if device.type != "cuda":
        return False
    if key not in results:
        if torch.cuda.is_current_stream_capturing():
            return False
        with torch.no_grad():
            results[key] = check()
    return results[key]


def frame_conv_check(input_shape: tuple[int, ...], weight_shape: tuple[int, ...], dtype: torch.dtype,
                     device: torch.device) -> bool:
    """Whether conv2d over the frames of seeded random [b, c, t, h, w] data (frame-major, folded into the batch)
    with a [c_out, c, 1, 1, 1] weight equals conv3d of the same values in NCDHW memory (no bias)."""
    b, c, t, h, w = input_shape
    c_out = weight_shape[0]
    x, weight = _seeded_conv_operands(input_shape, weight_shape, dtype, device)
    expected = torch.nn.functional.conv3d(x, weight)
    frames = x.permute(0, 2, 1, 3, 4).contiguous()  # [b, t, c, h, w]
    del x
    actual = torch.nn.functional.conv2d(frames.view(b * t, c, h, w), weight.view(c_out, c, 1, 1))
    return torch.equal(actual.view(b, t, c_out, h, w).permute(0, 2, 1, 3, 4), expected)


def frame_conv_is_exact(input_shape: tuple[int, ...], weight_shape: tuple[int, ...], dtype: torch.dtype,
                        device: torch.device) -> bool:
    key = (tuple(input_shape), tuple(weight_shape), dtype, str(device), _conv_settings())
    return _cached_conv_check(_FRAME_CONV_RESULTS, device, key, lambda: frame_conv_check(
        tuple(input_shape), tuple(weight_shape), dtype, device))


def results() -> dict[str, bool]:
    """What the self-tests found so far in this process (for reports)."""
    found = {f"silu {dtype} on {device}": ok for (device, dtype), ok in _RESULTS.items()}
    for (x_shape, w_shape, padding, dtype, device, _), ok in _CONV_RESULTS.items():
        found[f"channels-last conv {list(x_shape)} * {list(w_shape)} padding {list(padding)} {dtype} on {device}"] = ok
    for (x_shape, w_shape, dtype, device, _), ok in _FRAME_CONV_RESULTS.items():
        found[f"frame-major 1x1x1 conv {list(x_shape)} * {list(w_shape)} {dtype} on {device}"] = ok
    return found
