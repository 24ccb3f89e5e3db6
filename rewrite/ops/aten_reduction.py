"""The summation order of ATen's CUDA `linalg_vector_norm(x, 2, [1])` over the channels of a 4-D/5-D tensor.

The Wan RMS norm's denominator is ATen's fp32 L2 norm over dim 1. To compute it inside a fused kernel
and stay bit-identical, the kernel must add the squares in the order ATen's reduction kernel
(`Reduce.cuh`, `setReduceConfig` + `ReduceOp::thread_reduce_impl` + `block_y_reduce`) adds them. For this
*outer* reduction (the channel stride is larger than the output's fastest stride) each output is reduced
by the `split` threads of one block column:

  * thread y (0 <= y < split) walks channels y, y + split, y + 2 split, ...; its j-th value goes to
    accumulator j % 4 (`vt0` = 4), each accumulator a chain `acc = fma(v, v, acc)` from 0
    (`NormTwoOps::reduce` is `acc + v * v`, which nvcc contracts to an fma);
  * the thread's result is `((acc0 + acc1) + acc2) + acc3`;
  * the block combines the `split` thread results as a halving tree: `r[y] += r[y + split / 2]`, ...;
  * the norm is the IEEE square root of the sum.

`split` is what `setReduceConfig` computes from the number of outputs, the channel count and the output
vector width (`get_output_vec_size`: 4, 2 or 1 from the alignment of the data pointer and the strides).

For many channels over few outputs (Wan 2.2's 1024-channel norms) ATen also splits each output's channels
across `ctas` blocks (`ctas_per_output`, a global reduction):

  * thread y of block g walks channels y + g split, then every split * ctas channels (4 accumulators as above);
  * each block combines its threads with the halving tree: partial P_g;
  * the last block to finish (`global_reduce`) has thread y add P_y, P_{y + split}, P_{y + 2 split}, ... in
    that order to 0, then combines the split threads with the halving tree again.

Across 32-bit index sub-iterations (inputs of 2 GiB and more) `plan` returns None and callers keep ATen's
kernel.

The rules were read from PyTorch's `Reduce.cuh`; `tests/test_wan_fused_norm_conv.py` (gpu marker) checks the
resulting norms with `torch.equal` against ATen on the running GPU for every shape class the Wan decoders
produce (verified on torch 2.11; the order is not re-checked at run time).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import torch

MAX_THREADS = 512  # mnt_wrapper<float/half/bfloat16>::MAX_NUM_THREADS
WARP = 32
VT0 = 4  # accumulators per thread (gpu_reduce_kernel's default vt0, used by the norm kernels)
MIN_SPLIT_VALUES = 16
MAX_VALUES_PER_THREAD = 256


@dataclasses.dataclass(frozen=True)
class NormPlan:
    """How ATen's kernel reduces one output: `split` threads in each of `ctas` blocks, thread y of block g over
    channels y + g * split + k * split * ctas."""

    split: int
    vec: int
    ctas: int = 1


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def _output_dims(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[tuple[int, int]]:
    """(size, stride) of the non-reduced dims as TensorIterator orders and coalesces them: fastest first,
    size-1 dims dropped, neighbours merged when one continues the other."""
    dims = sorted(((s, st) for i, (s, st) in enumerate(zip(shape, strides)) if i != 1 and s != 1),
                  key=lambda d: d[1])
    merged: list[list[int]] = []
    for size, stride in dims:
        if merged and merged[-1][1] * merged[-1][0] == stride:
            merged[-1][0] *= size
        else:
            merged.append([size, stride])
    return [(s, st) for s, st in merged]


def output_vec_size(shape: tuple[int, ...], strides: tuple[int, ...], data_ptr: int, element_size: int) -> int:
    """`get_output_vec_size`: 4, halved until it divides the data pointer (in elements), the fastest output
    dim's size and every other input stride (the channel stride and the slower output strides)."""
    outputs = _output_dims(shape, strides)
    if not outputs or outputs[0][1] != 1:
        return 1  # ATen vectorizes along the output only when its fastest dim has unit stride
    vec = 4
    checks = [data_ptr // element_size]
    if outputs:
        checks.append(outputs[0][0])
        checks += [stride for _, stride in outputs[1:]]
    checks.append(strides[1])
    for n in checks:
        while n % vec:
            vec //= 2
    return vec


@functools.lru_cache(maxsize=None)
def _device_limits(index: int) -> tuple[int, int]:
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count, props.max_threads_per_multi_processor


def split_for(num_outputs: int, channels: int, vec: int, multiprocessors: int, threads_per_mp: int) -> tuple[int, int]:
    """`setReduceConfig` for an outer reduction: (threads splitting each output's channels in a block, blocks
    splitting them: `ctas_per_output`)."""
    max_threads = MAX_THREADS // vec
    dim0 = num_outputs // vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    dim1_pow2 = _last_pow2(channels) if channels < max_threads else max_threads
    width = min(dim0_pow2, WARP)
    height = min(dim1_pow2, max_threads // width)
    width = min(dim0_pow2, max_threads // height)
    step_output = width
    if channels >= min(height * MIN_SPLIT_VALUES, MAX_VALUES_PER_THREAD):
        split = height
    else:
        split, step_output = 1, step_output * height
    grid = -(-dim0 // step_output)
    target_grid = multiprocessors * (threads_per_mp // (width * height))
    values_per_thread = -(-channels // split)
    ctas = 1
    if split > 1 and values_per_thread >= MAX_VALUES_PER_THREAD and grid <= target_grid:
        ctas = max(min(-(-target_grid // grid), -(-values_per_thread // MIN_SPLIT_VALUES)),
                   -(-values_per_thread // MAX_VALUES_PER_THREAD))
    return split, ctas


def plan(x: torch.Tensor, reduced_dtype: torch.dtype, reference_contiguous: bool = False,
         rows: Optional[int] = None) -> Optional[NormPlan]:
    """ATen's order for `linalg_vector_norm(x.to(reduced_dtype), 2, [1], True)` on CUDA, or None where it is
    not reproduced. With an upcast, the fp32 copy ATen reduces is a fresh (aligned) tensor with x's strides.
    `reference_contiguous`: the order for a fresh contiguous tensor of x's shape (x is a stand-in in another
    layout for the tensor ATen's norm would see, e.g. a channels-last conv output for ATen's contiguous one).
    `rows`: x stands for a tensor of `rows` rows (dim -2), otherwise of x's shape, laid out densely in x's dim
    order (or contiguous) at x's address: a band of a sharded decode given the whole tensor's order. The order
    of one output depends on the whole tensor only through its output count and vector width."""
    if not x.is_cuda or x.dim() not in (4, 5) or not x.numel():
        return None
    shape = tuple(x.shape) if rows is None else (*x.shape[:-2], int(rows), x.shape[-1])
    element_size = torch.empty((), dtype=reduced_dtype).element_size()
    numel = math.prod(shape)
    if numel * element_size >= 2**31:  # TensorIterator would split into 32-bit sub-iterations
        return None
    if reference_contiguous:
        strides, data_ptr = _contiguous_strides(shape), 0
    elif not _non_overlapping_dense(x):
        return None
    else:
        strides = tuple(x.stride()) if rows is None else dense_strides_in_order(shape, tuple(x.stride()))
        data_ptr = x.data_ptr() if reduced_dtype == x.dtype else 0
    return plan_of(shape, strides, data_ptr, element_size, x.device.index or 0)


def plan_of(shape: tuple[int, ...], strides: tuple[int, ...], data_ptr: int, element_size: int,
            device_index: int) -> Optional[NormPlan]:
    """`plan` for a dense tensor of `shape` and `strides` at `data_ptr` (elements of `element_size` bytes as
    ATen reduces them) on CUDA device `device_index`."""
    outputs = _output_dims(shape, strides)
    if not outputs or outputs[0][1] >= strides[1]:
        return None  # an inner reduction (channels fastest): another kernel and order
    vec = output_vec_size(shape, strides, data_ptr, element_size)
    num_outputs = math.prod(shape) // shape[1]
    split, ctas = split_for(num_outputs, shape[1], vec, *_device_limits(device_index))
    return NormPlan(split=split, vec=vec, ctas=ctas)


def dense_strides_in_order(shape: tuple[int, ...], like_strides: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of a dense tensor of `shape` whose dims are laid out in the order `like_strides` gives
    them (outermost first by stride, ties kept in dim order)."""
    order = sorted(range(len(shape)), key=lambda d: -like_strides[d])
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _non_overlapping_dense(x: torch.Tensor) -> bool:
    """The fp32 copy keeps x's strides (`preserve_format`) only when x is dense; we reproduce only that case."""
    expected = 1
    for size, stride in sorted(zip(x.shape, x.stride()), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True
