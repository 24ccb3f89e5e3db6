"""Host-side layout rules of the Wan ops and the norm plans: what each op returns, and in which memory.

A replaced subgraph fixes its output's layout, and the custom op that replaces it returns the same layout
(its users, and the graph's `meta['val']`, were traced with it) on its kernel path, on its reference path and
in its fake, with one exception: the next cache of the channels-last causal convs is channels-last on both
paths (what their pad kernels write; caches only come back to those ops). This module is where the op and
its fake read those rules from:

- shapes: `padded_shape` (the causal conv's padded input), `conv_output_shape`, `upsample_conv2d_output_shape`;
- strides: `reference_layout` (the strides ATen gives a reference computation, run on fake tensors of the
  device, cached) and the rules derived from it (`conv_output_strides`); the memory formats ATen's kernels
  allocate (`suggest_memory_format`, `cat_memory_format`), for the fakes, which must not guard on symbolic
  sizes; `channels_last_cache`, `frame_major`;
- what the 5-D kernels can index: `as5d`, `planes_contiguous`, `run_stride`;
- `norm_plan`: where the one-kernel RMS norm reproduces ATen's summation order (`rewrite.ops.aten_reduction`)
  and how many ATen threads it emulates.

No kernel here: the kernel modules (`rewrite.ops.triton_*`) and the ops (`rewrite.ops.wan`) import this one.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch._prims_common
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode

from rewrite.ops import aten_reduction, run_context


# ---- what the kernels index ---------------------------------------------------------------------------------
def as5d(t: Tensor) -> Tensor:
    """A 4-D [N, C, H, W] tensor as [N, C, 1, H, W] (a view); 5-D tensors as they are."""
    return t.unsqueeze(2) if t.dim() == 4 else t


def planes_contiguous(*tensors: Tensor) -> bool:
    """Every 5-D tensor's (h, w) plane is one contiguous run (the plane kernels' precondition)."""
    return all(t.shape[3] * t.shape[4] <= 1 or (t.stride(4) == 1 and (t.shape[3] == 1 or t.stride(3) == t.shape[4]))
               for t in tensors)


def run_stride(t: Tensor) -> int | None:
    """The stride of a 5-D tensor's (h, w) positions as one run (h stride = W * w stride), else None."""
    _, _, _, h, w = t.shape
    if h == 1:
        return t.stride(4)
    if w == 1:
        return t.stride(3)
    return t.stride(4) if t.stride(3) == w * t.stride(4) else None


# ---- the layouts ATen gives ---------------------------------------------------------------------------------
_LAYOUTS: dict[tuple, tuple[int, ...]] = {}


def reference_layout(key: tuple, fn: Callable, *tensors: Tensor) -> tuple[int, ...]:
    """The strides ATen gives `fn(*tensors)`'s output on the tensors' device, computed once per `key`, device and
    layout on fake tensors (ATen's meta kernels with the device's rules: a conv of channels-last operands, say,
    returns channels-last on CPU and CUDA but not on the meta device). The fakes of the ops run their references
    on fake tensors too, so a kernel path allocating these strides returns what the fake promises.

    `key` names what `fn` computes (its non-tensor arguments included): `fn` itself may be a new lambda
    on every call.
    """
    signature = key + tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.device.type) for t in tensors)
    strides = _LAYOUTS.get(signature)
    if strides is None:
        with FakeTensorMode():
            fakes = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device) for t in tensors]
            strides = _LAYOUTS[signature] = tuple(fn(*fakes).stride())
    return strides


def conv_output_strides(shape: list[int], residual: Optional[Tensor]) -> tuple[int, ...]:
    """The layout of a causal conv's replaced output: ATen's conv of the contiguous padded input is
    contiguous; with a residual, the add's layout over that and the residual."""
    if residual is None:
        return tuple(torch.empty(shape, device="meta").stride())  # contiguous
    return reference_layout(("add_contiguous",), lambda r: torch.add(torch.empty_like(r, memory_format=torch.contiguous_format), r), residual)


def suggest_memory_format(t: Tensor) -> torch.memory_format:
    """`Tensor.suggest_memory_format()` (also for symbolic shapes, without guards): channels-last where the
    strides say so, else contiguous. ATen's pad, upsample and conv kernels allocate their outputs in it."""
    return torch._prims_common.suggest_memory_format(t)


def cat_memory_format(*tensors: Tensor) -> torch.memory_format:
    """The memory format of ATen's `cat` of these tensors: their common suggested format, contiguous if any
    suggests contiguous or they disagree (`compute_output_memory_format` in ATen)."""
    formats = {suggest_memory_format(t) for t in tensors}
    return formats.pop() if len(formats) == 1 else torch.contiguous_format


def empty(shape, like: Tensor, memory_format: torch.memory_format = torch.contiguous_format) -> Tensor:
    """An empty tensor of `like`'s dtype and device in `memory_format`."""
    return torch.empty(shape, dtype=like.dtype, device=like.device, memory_format=memory_format)


def channels_last_cache(cache: Tensor) -> Tensor:
    """A causal conv's next cache in the layout the channels-last conv ops return it (channels-last: what their
    pad kernels write), copied so where it is not."""
    return cache.contiguous(memory_format=torch.channels_last_3d)


def frame_major(x: Tensor) -> bool:
    """x is 5-D with [b, t, c, h, w] memory (what the up blocks' 2-D upsampler convs leave behind)."""
    return x.dim() == 5 and x.permute(0, 2, 1, 3, 4).is_contiguous()


# ---- shapes -------------------------------------------------------------------------------------------------
def padded_shape(x_shape, cache: Optional[Tensor], pad: list[int], mode: str) -> tuple[int, ...]:
    """The shape of the conv input `causal_conv_input` assembles (chunk 0 reads no cache)."""
    b, c, t, h, w = x_shape
    frames = t + (0 if mode == "chunk0" or cache is None else cache.shape[2]) + pad[4] + pad[5]
    return (b, c, frames, h + pad[2] + pad[3], w + pad[0] + pad[1])


def conv_output_shape(in_shape, weight_shape) -> list[int]:
    """The output shape of an unpadded unit-stride conv."""
    return [in_shape[0], weight_shape[0], *(n - k + 1 for n, k in zip(in_shape[2:], weight_shape[2:]))]


def upsample_conv2d_output_shape(x_shape, weight_shape, padding: list[int]) -> list[int]:
    """[n, c_out, h, w] of the unit-stride conv2d of the 2x-upsampled [n, c, h, w] input."""
    n, _, h, w = x_shape
    kh, kw = weight_shape[2:]
    return [n, weight_shape[0], 2 * h + 2 * padding[0] - kh + 1, 2 * w + 2 * padding[1] - kw + 1]


# ---- the norm plan ------------------------------------------------------------------------------------------
MAX_NORM_THREADS = 64  # split x padded ctas rows of accumulators the fused norm holds (4 each): Wan's <= 4 x 16


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def norm_threads(split: int, ctas: int) -> int:
    """Rows of ATen threads the fused norm emulates per pixel: split x ctas padded to a power of 2."""
    return split * next_power_of_2(ctas)


def norm_plan(x: Tensor, upcast: bool, reference_contiguous: bool = False):
    """ATen's summation order for this CUDA norm input, or None (then ATen's reduction kernel runs; also where
    the run context turns the fused norm off, ``run_context.using(fused_norm=False)``).
    `reference_contiguous`: x stands in for a contiguous tensor (`aten_reduction.plan`); its (h, w) positions
    need only be one strided run."""
    if not run_context.current().fused_norm or not x.is_cuda or (x.dtype != torch.float32) != upcast:
        return None
    x5 = as5d(x)
    if not (run_stride(x5) is not None if reference_contiguous else planes_contiguous(x5)):
        return None
    plan = aten_reduction.plan(x, torch.float32, reference_contiguous)
    return None if plan is None or norm_threads(plan.split, plan.ctas) > MAX_NORM_THREADS else plan
