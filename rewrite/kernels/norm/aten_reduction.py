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

Inputs of 2 GiB and more: ATen cannot index them with 32 bits, so `gpu_reduce_kernel` runs the reduction as
the sub-iterations of `TensorIterator::with_32bit_indexing`, which halves the dim of largest byte extent until
each piece fits (`split_pieces` transcribes it). Pieces that split the outputs are independent reductions; a
piece that splits the channels leaves its raw sum in the output and the next piece of those outputs adds its
own sum to it (`ops.combine`), the square root taken after the last. Where every piece has the same plan and
every output the same channel pieces, the plan carries the channel boundaries (`NormPlan.pieces`) and the
kernel sums each piece in the plan's order and adds them left to right; otherwise `plan` returns None and
callers keep ATen's kernel.

The rules were read from PyTorch's `Reduce.cuh`; `tests/kernels/norm/test_rms_norm.py` (gpu marker) checks the
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
INT32_MAX = 2**31 - 1
MAX_PIECES = 4  # 32-bit pieces of one output the norm kernels add (an fp32 copy of up to 8 GiB over the channels)


@dataclasses.dataclass(frozen=True)
class NormPlan:
    """How ATen's kernel reduces one output: `split` threads in each of `ctas` blocks, thread y of block g over
    channels y + g * split + k * split * ctas."""

    split: int
    vec: int
    ctas: int = 1
    pieces: tuple[int, ...] = ()  # inner channel boundaries of the 32-bit pieces (module docstring); () for one


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
    if reference_contiguous:
        strides, data_ptr = _contiguous_strides(shape), 0
    elif not _non_overlapping_dense(x):
        return None
    else:
        strides = tuple(x.stride()) if rows is None else dense_strides_in_order(shape, tuple(x.stride()))
        data_ptr = x.data_ptr() if reduced_dtype == x.dtype else 0
    if _max_offset(shape, strides, element_size) > INT32_MAX or math.prod(shape) > INT32_MAX:
        return split_plan(shape, strides, data_ptr, element_size, x.device.index or 0)
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


def _max_offset(shape: tuple[int, ...], strides: tuple[int, ...], element_size: int) -> int:
    """`can_use_32bit_indexing`'s bound for one operand: 1 + the largest byte offset."""
    return 1 + sum((size - 1) * abs(stride) * element_size for size, stride in zip(shape, strides) if size)


@dataclasses.dataclass(frozen=True)
class _IterDim:
    """One dim of the reduction's TensorIterator: size and byte strides of the output and the input."""

    size: int
    out_stride: int
    in_stride: int


def _iterator_dims(shape: tuple[int, ...], strides: tuple[int, ...], element_size: int) -> Optional[list[_IterDim]]:
    """The dims of the TensorIterator of `linalg_vector_norm(x, 2, [1], keepdim=True)`, fastest first: the
    reduced channel dim (output stride 0, moved to the front by `reorder_dimensions`), then the output dims in
    the order of the output's (contiguous) strides, neighbours coalesced where both operands continue. None
    where x's own order of the output dims differs from the output's (a layout this transcription does not
    cover)."""
    out_shape = (shape[0], 1, *shape[2:])
    out_strides = _contiguous_strides(out_shape)
    order = [d for d in reversed(range(len(shape))) if d != 1 and shape[d] != 1]
    if [strides[d] for d in order] != sorted(strides[d] for d in order):
        return None
    dims = [_IterDim(shape[1], 0, strides[1] * element_size)]
    merged: list[_IterDim] = []
    for d in order:
        dim = _IterDim(shape[d], out_strides[d] * 4, strides[d] * element_size)
        last = merged[-1] if merged else None
        if last and last.size * last.out_stride == dim.out_stride and last.size * last.in_stride == dim.in_stride:
            merged[-1] = _IterDim(last.size * dim.size, last.out_stride, last.in_stride)
        else:
            merged.append(dim)
    return dims + merged


def split_pieces(dims: list[_IterDim]) -> list[tuple[tuple[int, int], ...]]:
    """`SplitUntil32Bit` over the iterator `dims`: the (start, size) of every dim in each piece, in the order
    ATen runs them. A piece that does not fit is halved along `get_dim_to_split`'s dim (largest byte extent of
    any operand, the slowest dim on a tie), the first half (size // 2) first."""
    def fits(ranges) -> bool:
        numel = math.prod(size for _, size in ranges)
        return numel <= INT32_MAX and all(
            1 + sum((size - 1) * abs(getattr(d, stride)) for d, (_, size) in zip(dims, ranges)) <= INT32_MAX
            for stride in ("out_stride", "in_stride"))

    def dim_to_split(ranges) -> int:
        best, chosen = -1, -1
        for index in reversed(range(len(dims))):
            size = ranges[index][1]
            for stride in (dims[index].out_stride, dims[index].in_stride):
                if size and (size - 1) * abs(stride) > best:
                    best, chosen = (size - 1) * abs(stride), index
        return chosen

    pieces, stack = [], [tuple((0, d.size) for d in dims)]
    while stack:
        ranges = stack.pop()
        if fits(ranges):
            pieces.append(ranges)
            continue
        index = dim_to_split(ranges)
        start, size = ranges[index]
        first = ranges[:index] + ((start, size // 2),) + ranges[index + 1:]
        second = ranges[:index] + ((start + size // 2, size - size // 2),) + ranges[index + 1:]
        stack += [second, first]
    return pieces


def split_plan(shape: tuple[int, ...], strides: tuple[int, ...], data_ptr: int, element_size: int,
               device_index: int) -> Optional[NormPlan]:
    """The plan of a norm input ATen reduces in 32-bit pieces (module docstring), or None where the pieces do
    not share one plan and one channel partition, or need more than MAX_PIECES pieces per output."""
    dims = _iterator_dims(shape, strides, element_size)
    if dims is None or len(dims) < 2 or dims[1].in_stride >= dims[0].in_stride:
        return None  # (the last: an inner reduction, another kernel and order)
    channels_by_outputs: dict[tuple, list[tuple[int, int]]] = {}
    plans = set()
    for ranges in split_pieces(dims):
        (c_start, c_size), outputs = ranges[0], ranges[1:]
        channels_by_outputs.setdefault(outputs, []).append((c_start, c_size))
        offset = sum(start * d.in_stride for d, (start, _) in zip(dims, ranges)) // element_size
        vec = 4 if dims[1].in_stride == element_size else 1  # `get_output_vec_size`, as `output_vec_size`
        for n in (data_ptr // element_size + offset, outputs[0][1],
                  *(d.in_stride // element_size for d in (dims[0], *dims[2:]))):
            while n % vec:
                vec //= 2
        num_outputs = math.prod(size for _, size in outputs)
        split, ctas = split_for(num_outputs, c_size, vec, *_device_limits(device_index))
        plans.add(NormPlan(split=split, vec=vec, ctas=ctas))
    partitions = {tuple(channels) for channels in channels_by_outputs.values()}
    if len(plans) != 1 or len(partitions) != 1:
        return None
    partition = partitions.pop()
    if len(partition) > MAX_PIECES or [start for start, _ in partition] != sorted(start for start, _ in partition):
        return None
    plan = plans.pop()
    return dataclasses.replace(plan, pieces=tuple(start for start, _ in partition[1:]))


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
