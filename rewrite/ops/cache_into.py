"""Ops that can write their next causal-conv caches straight into the buffers of the old ones.

A Wan step graph reads each causal conv's cache (the last two frames of its input in the previous chunk)
and returns the next one; the runtime then copies the new cache into the static cache buffer that the next
replay reads (`rewrite.models.wan.cache_writes`): two frames read and written again per conv and step. The
ops declared here with `writes_next_caches` can skip that copy: called through `write_next_caches_into`
with the old cache buffers, their kernel paths write the next cache into the buffer itself, after the pad
kernel has read the old frames from it (`triton_pad.causal_pad_rest_channels_last`).

Why not an op argument: a custom op's outputs may not alias its inputs, and making these ops mutate their
caches would make every graph that holds them impure. So `write_next_caches_into` calls the op's Python
implementation (not the dispatcher) with the buffers in a context variable; the implementation takes them
at its start (`taken`: nested op calls, e.g. a fallback to another op, see none) and passes each down to its
pad kernel where `buffer_for` allows it. Wherever a path does not write into the buffer (a fallback, the
reference ops, one frame of x), `write_next_caches_into` copies its fresh next cache into the buffer: the
values the buffers end with are always the op's outputs.

Exactness: exact (the same values land in the same buffers; only the copy is gone).
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, Optional

import torch
from torch import Tensor

__all__ = ["buffer_for", "next_cache_writers", "taken", "write_next_caches_into", "writes_next_caches"]

# qualified op name -> (its Python implementation, {output index: the name of the cache argument it follows})
_WRITERS: dict[str, tuple[Callable[..., Any], dict[int, str]]] = {}
_BUFFERS: contextvars.ContextVar[dict[int, Tensor]] = contextvars.ContextVar("next_cache_buffers", default={})


def writes_next_caches(outputs: dict[int, str]) -> Callable[[Any], Any]:
    """Declare of a `torch.library.custom_op` (applied above its decorator) that its output at each index of
    `outputs` is the next cache of the cache argument named there, and that its implementation takes
    buffers for them (`taken`, `buffer_for`); returns the op unchanged."""

    def declare(op: Any) -> Any:
        names = [a.name for a in op._opoverload._schema.arguments]
        for index, name in outputs.items():
            if name not in names or not 0 <= index < len(op._opoverload._schema.returns):
                raise ValueError(f"{op._qualname}: no output {index} or cache argument {name!r} (arguments: {names})")
        _WRITERS[op._qualname] = (op._init_fn, dict(outputs))
        return op

    return declare


def next_cache_writers() -> dict[str, dict[int, str]]:
    """Every declared op (qualified name -> {output index: cache argument name}); declared on import."""
    return {name: dict(outputs) for name, (_, outputs) in _WRITERS.items()}


def taken() -> dict[int, Tensor]:
    """The buffers `write_next_caches_into` gave this call ({output index: buffer}; usually none), cleared
    for the rest of the call so that the ops it calls in turn write new tensors."""
    buffers = _BUFFERS.get()
    if buffers:
        _BUFFERS.set({})
    return buffers


def buffer_for(buffer: Optional[Tensor], cache: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
    """`buffer` where the pad kernel may write the next cache of (`cache`, x) into it: it is that cache itself
    (read by the pad kernel first), channels-last, and x has two frames or more (so the next cache comes from
    x alone, written after the cache is read); else None (a new tensor, copied by the caller)."""
    if buffer is None or cache is None or buffer is not cache or x.dim() != 5 or x.shape[2] < 2:
        return None
    b, c, _, h, w = x.shape
    if (tuple(buffer.shape) != (b, c, 2, h, w) or buffer.dtype != x.dtype
            or not buffer.is_contiguous(memory_format=torch.channels_last_3d)):
        return None
    return buffer


def write_next_caches_into(op: torch._ops.OpOverload, outputs: tuple[int, ...], buffers: tuple[Tensor, ...],
                           *args: Any, **kwargs: Any) -> tuple[Tensor, ...]:
    """`op(*args, **kwargs)` with its next caches (the outputs at `outputs`) in `buffers`: the op's
    implementation writes them there where its kernel path can, and the rest are copied in. Returns the
    op's outputs with the buffers in those places. (An FX node target of the runtime's step graphs.)"""
    implementation, _ = _WRITERS[op._schema.name]
    token = _BUFFERS.set(dict(zip(outputs, buffers)))
    try:
        result = list(implementation(*args, **kwargs))
    finally:
        _BUFFERS.reset(token)
    for index, buffer in zip(outputs, buffers):
        if result[index] is not buffer:
            buffer.copy_(result[index])
            result[index] = buffer
    return tuple(result)
