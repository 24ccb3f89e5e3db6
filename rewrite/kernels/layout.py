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
- `norm_plan`: where the one-kernel RMS norm reproduces ATen's summation order (`rewrite.kernels.norm.aten_reduction`)
  and how many ATen threads it emulates.

No kernel here: the kernel modules (`rewrite.kernels.*`) and the ops (`rewrite.models.wan.ops`) import this one.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch._prims_common
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode

from rewrite.ops import run_context
from rewrite.kernels.norm import aten_reduction


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


def add_contiguous_layout(t: Tensor, contiguous_first: bool) -> tuple[int, ...]:
    """The strides of ATen's add of `t` and a contiguous tensor of its shape: ``contiguous + t`` where
    `contiguous_first`, else ``t + contiguous``. Keyed by the order, because TensorIterator breaks layout ties by
    operand order: for a frame-major `t` the first keeps the contiguous layout and the second `t`'s."""
    if contiguous_first:
        return reference_layout(("add_contiguous_first",),
                                lambda a: torch.empty_like(a, memory_format=torch.contiguous_format) + a, t)
    return reference_layout(("add_contiguous_second",),
                            lambda a: a + torch.empty_like(a, memory_format=torch.contiguous_format), t)


def conv_output_strides(shape: list[int], residual: Optional[Tensor]) -> tuple[int, ...]:
    """The layout of a causal conv's replaced output: ATen's conv of the contiguous padded input is
    contiguous; with a residual, the add's layout over that and the residual."""
    if residual is None:
        return tuple(torch.empty(shape, device="meta").stride())  # contiguous
    return add_contiguous_layout(residual, contiguous_first=True)


def suggest_memory_format(t: Tensor) -> torch.memory_format:
    """`Tensor.suggest_memory_format()` (also for symbolic shapes, without guards): channels-last where the
    strides say so, else contiguous. ATen's pad, upsample and conv kernels allocate their outputs in it."""
    return torch._prims_common.suggest_memory_format(t)


def cat_memory_format(*tensors: Tensor) -> torch.memory_format:
    """The memory format of ATen's `cat` of these tensors: their common suggested format, contiguous if any
    suggests contiguous or they disagree (`compute_output_memory_format` in ATen)."""
    formats = {suggest_memory_format(t) for t in tensors}
    return formats.pop() if len(formats) == 1 else torch.contiguous_format


def strides_memory_format(shape, strides) -> torch.memory_format:
    """`suggest_memory_format` of a tensor of this shape and these strides (a view, say), without making it."""
    if torch._prims_common.are_strides_like_channels_last_or_false(shape, strides):
        return torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    return torch.contiguous_format


# ---- plain layouts: what lets the fakes decide layouts without making tensors ------------------------------
#: physical dim orders (as `torch.empty_permuted` takes them) of the 5-D layouts `plain_order` recognises
CONTIGUOUS_ORDER, CHANNELS_LAST_ORDER, FRAME_MAJOR_ORDER = (0, 1, 2, 3, 4), (0, 2, 3, 4, 1), (0, 2, 1, 3, 4)


def _expr(n):
    """A size or stride as something `==` compares structurally (a SymInt's sympy expression): no guard."""
    return n.node.expr if isinstance(n, torch.SymInt) else n


def _at_least(n, low: int) -> bool:
    """`n >= low` for a size, decided without a guard (a SymInt: from its value range)."""
    if not isinstance(n, torch.SymInt):
        return n >= low
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(n >= low)


def plain_shape(shape) -> bool:
    """A 5-D [b, c, t, h, w] shape whose plain layouts cannot be confused: a static frame count, no size 0, and
    channels, height and width of 2 or more (known without a guard)."""
    return (len(shape) == 5 and isinstance(shape[2], int) and all(_at_least(n, 1) for n in shape)
            and all(_at_least(shape[d], 2) for d in (1, 3, 4)))


def order_strides(shape, order) -> list:
    """The strides `torch.empty_permuted(shape, order)` gives (sizes >= 1)."""
    strides: list = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step = step * shape[d]
    return strides


def order_memory_format(order) -> torch.memory_format:
    """What `suggest_memory_format` says of a tensor laid out plainly in `order`."""
    return torch.channels_last_3d if tuple(order) == CHANNELS_LAST_ORDER else torch.contiguous_format


def plain_order(t: Tensor) -> Optional[tuple]:
    """The dim order in which the 5-D `t` is laid out as a fresh tensor of its shape would be, where
    `plain_shape` holds: `CONTIGUOUS_ORDER` (a single frame's stride aside), `CHANNELS_LAST_ORDER` or, with 2 or
    more frames, `FRAME_MAJOR_ORDER` (strides compared as expressions); else None.

    ATen's layout decisions about such a tensor follow from its order alone: `suggest_memory_format` says
    `order_memory_format(order)`, and `empty_like` of it, or of a view of some of its frames, is laid out in
    `order` (the strides are strictly ordered: ATen's stride sort has no tie to break). The fakes use that to
    skip making and viewing intermediate tensors."""
    if t.dim() != 5 or not plain_shape(t.shape):
        return None
    shape, strides = t.shape, [_expr(s) for s in t.stride()]
    for order in (CONTIGUOUS_ORDER, CHANNELS_LAST_ORDER, FRAME_MAJOR_ORDER):
        if order == FRAME_MAJOR_ORDER and shape[2] < 2:
            break
        if all(a == _expr(b) or (order == CONTIGUOUS_ORDER and d == 2 and shape[2] == 1)
               for d, (a, b) in enumerate(zip(strides, order_strides(shape, order)))):
            return order
    return None


def empty_in_order(shape, like: Tensor, order) -> Tensor:
    """An empty tensor of `like`'s dtype and device laid out in `order` (what `empty_like` of a tensor so laid
    out makes)."""
    return torch.empty_permuted(shape, order, dtype=like.dtype, device=like.device)


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


def norm_plan(x: Tensor, upcast: bool, reference_contiguous: bool = False, rows: Optional[int] = None):
    """ATen's summation order for this CUDA norm input, or None (then ATen's reduction kernel runs; also where
    the run context turns the fused norm off, ``run_context.using(fused_norm=False)``).
    `reference_contiguous`: x stands in for a contiguous tensor (`aten_reduction.plan`); its (h, w) positions
    need only be one strided run. `rows`: x is a band of a tensor of that many rows, whose order it takes
    (`aten_reduction.plan`)."""
    if not run_context.current().fused_norm or not x.is_cuda or (x.dtype != torch.float32) != upcast:
        return None
    x5 = as5d(x)
    if not (run_stride(x5) is not None if reference_contiguous else planes_contiguous(x5)):
        return None
    plan = aten_reduction.plan(x, torch.float32, reference_contiguous, rows)
    return None if plan is None or norm_threads(plan.split, plan.ctas) > MAX_NORM_THREADS else plan
