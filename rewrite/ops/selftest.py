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
conv3d of the NCDHW input that ATen runs. `strided_channels_last_conv_is_exact(input_shape, weight_shape,
stride, dtype, device)`: likewise for an unpadded conv of that stride (the encoder's downsamplers).

Cost and persistence: `stats()` counts the checks computed in this process and their seconds (per kind;
`thread_seconds()` for the calling thread alone, which the runtime reads before and after a capture to
attribute the checks to it). `verdicts(device)` lists the verdicts found for a device as plain records and
`adopt(device, records)` takes such records back (`rewrite.runtime.disk_cache` keeps them across processes,
keyed by the torch, CUDA, cuDNN and Triton versions and the GPU); a verdict already found in this process is
kept. The SiLU check runs its kernel for real even inside a compile-ahead pass (`rewrite.ops.compile_ahead`,
where launches only compile).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable

import torch

from rewrite.ops import run_context
from rewrite.kernels.norm import rms_norm as triton_norm

_RESULTS: dict[tuple[str, torch.dtype], bool] = {}
_CONV_RESULTS: dict[tuple, bool] = {}
_FRAME_CONV_RESULTS: dict[tuple, bool] = {}
_STRIDED_CONV_RESULTS: dict[tuple, bool] = {}

#: the check kinds, as `stats` and the verdict records name them
KINDS = ("silu", "channels_last_conv", "frame_conv", "strided_channels_last_conv")

_STATS_LOCK = threading.Lock()
_COUNTS: collections.Counter = collections.Counter()  # kind -> checks computed in this process
_SECONDS: collections.Counter = collections.Counter()  # kind -> their seconds
_THREAD = threading.local()  # .seconds: this thread's checks, cumulative


def _timed(kind: str, check: Callable[[], bool]) -> bool:
    """`check()`, counted and timed (process-wide per kind, and for this thread)."""
    start = time.perf_counter()
    try:
        return check()
    finally:
        seconds = time.perf_counter() - start
        _THREAD.seconds = getattr(_THREAD, "seconds", 0.0) + seconds
        with _STATS_LOCK:
            _COUNTS[kind] += 1
            _SECONDS[kind] += seconds


def stats() -> dict[str, tuple[int, float]]:
    """kind -> (checks computed in this process, their seconds)."""
    with _STATS_LOCK:
        return {kind: (_COUNTS[kind], _SECONDS[kind]) for kind in KINDS}


def thread_seconds() -> float:
    """Seconds the calling thread has spent computing checks so far (cumulative)."""
    return getattr(_THREAD, "seconds", 0.0)


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
        with run_context.using(compile_ahead=False):  # the kernel must run: a compile-only launch writes nothing
            _RESULTS[key] = _timed("silu", lambda: silu_check(device, dtype)[0])
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
                             device: torch.device, padding: tuple[int, ...] = (0, 0, 0), stride: int | tuple = 1) -> bool:
    """Whether conv2d/conv3d (by the weight's rank; `stride`, `padding`) of seeded random contiguous operands
    equals the same conv of the same values in channels-last memory (no bias)."""
    conv = torch.nn.functional.conv3d if len(weight_shape) == 5 else torch.nn.functional.conv2d
    memory_format = torch.channels_last_3d if len(weight_shape) == 5 else torch.channels_last
    stride = stride if isinstance(stride, int) else list(stride)
    x, weight = _seeded_conv_operands(input_shape, weight_shape, dtype, device)
    expected = conv(x, weight, None, stride, list(padding))
    x = x.contiguous(memory_format=memory_format)  # the contiguous copy is freed here
    actual = conv(x, weight.contiguous(memory_format=memory_format), None, stride, list(padding))
    return torch.equal(actual, expected)


def channels_last_conv_is_exact(input_shape: tuple[int, ...], weight_shape: tuple[int, ...], dtype: torch.dtype,
                                device: torch.device, padding: tuple[int, ...] = (0, 0, 0)) -> bool:
    key = (tuple(input_shape), tuple(weight_shape), tuple(padding), dtype, str(device), _conv_settings())
    return _cached_conv_check(_CONV_RESULTS, "channels_last_conv", device, key, lambda: channels_last_conv_check(
        tuple(input_shape), tuple(weight_shape), dtype, device, tuple(padding)))


def strided_channels_last_conv_is_exact(input_shape: tuple[int, ...], weight_shape: tuple[int, ...],
                                        stride: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> bool:
    """`channels_last_conv_is_exact` for an unpadded conv of `stride` (the encoder's downsamplers, whose zero pad is
    written ahead of the conv: `rewrite.models.wan.downsample`)."""
    key = (tuple(input_shape), tuple(weight_shape), tuple(stride), dtype, str(device), _conv_settings())
    return _cached_conv_check(_STRIDED_CONV_RESULTS, "strided_channels_last_conv", device, key,
                              lambda: channels_last_conv_check(tuple(input_shape), tuple(weight_shape), dtype, device,
                                                               (0,) * (len(weight_shape) - 2), tuple(stride)))


def _cached_conv_check(results: dict[tuple, bool], kind: str, device: torch.device, key: tuple, check) -> bool:
    """`check()`'s verdict, computed once per key (no_grad); False off CUDA, and without caching during a CUDA
    graph capture."""
    if device.type != "cuda":
        return False
    if key not in results:
        if torch.cuda.is_current_stream_capturing():
            return False
        with torch.no_grad():
            results[key] = _timed(kind, check)
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
    return _cached_conv_check(_FRAME_CONV_RESULTS, "frame_conv", device, key, lambda: frame_conv_check(
        tuple(input_shape), tuple(weight_shape), dtype, device))


def results() -> dict[str, bool]:
    """What the self-tests found so far in this process (for reports)."""
    found = {f"silu {dtype} on {device}": ok for (device, dtype), ok in _RESULTS.items()}
    for (x_shape, w_shape, padding, dtype, device, _), ok in _CONV_RESULTS.items():
        found[f"channels-last conv {list(x_shape)} * {list(w_shape)} padding {list(padding)} {dtype} on {device}"] = ok
    for (x_shape, w_shape, dtype, device, _), ok in _FRAME_CONV_RESULTS.items():
        found[f"frame-major 1x1x1 conv {list(x_shape)} * {list(w_shape)} {dtype} on {device}"] = ok
    for (x_shape, w_shape, stride, dtype, device, _), ok in _STRIDED_CONV_RESULTS.items():
        found[f"channels-last conv {list(x_shape)} * {list(w_shape)} stride {list(stride)} {dtype} on {device}"] = ok
    return found


# ---- verdicts as records (for `rewrite.runtime.disk_cache`) ---------------------------------------------------
_DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16)}


def verdicts(device: torch.device) -> list[dict]:
    """The verdicts found in this process for `device`, as JSON-compatible records (device not included: the
    caller keys them by the device's kind and software)."""
    name = str(device)
    records = [{"check": "silu", "dtype": str(dtype), "exact": ok}
               for (where, dtype), ok in list(_RESULTS.items()) if where == name]
    records += [{"check": "channels_last_conv", "input": list(x), "weight": list(w), "padding": list(p),
                 "dtype": str(dtype), "settings": list(settings), "exact": ok}
                for (x, w, p, dtype, where, settings), ok in list(_CONV_RESULTS.items()) if where == name]
    records += [{"check": "frame_conv", "input": list(x), "weight": list(w), "dtype": str(dtype),
                 "settings": list(settings), "exact": ok}
                for (x, w, dtype, where, settings), ok in list(_FRAME_CONV_RESULTS.items()) if where == name]
    records += [{"check": "strided_channels_last_conv", "input": list(x), "weight": list(w), "stride": list(st),
                 "dtype": str(dtype), "settings": list(settings), "exact": ok}
                for (x, w, st, dtype, where, settings), ok in list(_STRIDED_CONV_RESULTS.items()) if where == name]
    return records


def adopt(device: torch.device, records: list[dict]) -> int:
    """Take verdicts of `device` from records that `verdicts` wrote (in another process); returns how many
    were new here. All or nothing: a malformed record raises ValueError and nothing is adopted."""
    name, entries = str(device), []
    for record in records:
        try:
            check, dtype, ok = record["check"], _DTYPES[record["dtype"]], record["exact"]
            if not isinstance(ok, bool):
                raise TypeError("exact is not a bool")
            if check == "silu":
                entries.append((_RESULTS, (name, dtype), ok))
                continue
            shapes = tuple(_ints(record["input"])), tuple(_ints(record["weight"]))
            settings = tuple(record["settings"])
            if len(settings) != len(_conv_settings()) or not all(isinstance(v, bool) for v in settings):
                raise TypeError("settings are not the cuDNN flags")
            if check == "channels_last_conv":
                entries.append((_CONV_RESULTS, (*shapes, tuple(_ints(record["padding"])), dtype, name, settings), ok))
            elif check == "frame_conv":
                entries.append((_FRAME_CONV_RESULTS, (*shapes, dtype, name, settings), ok))
            elif check == "strided_channels_last_conv":
                entries.append((_STRIDED_CONV_RESULTS, (*shapes, tuple(_ints(record["stride"])), dtype, name, settings),
                                ok))
            else:
                raise KeyError(check)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"malformed self-check record {record!r}: {type(error).__name__}: {error}") from error
    new = 0
    for results, key, ok in entries:
        if key not in results:
            results[key] = ok
            new += 1
    return new


def _ints(values) -> list[int]:
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{values!r} is not a list of ints")
    return values
