"""When a custom op may run its Triton kernel, and the backend setting that forces either implementation.

A kernel serves a call only for CUDA tensors (or CPU tensors while `TRITON_INTERPRET=1` and the backend
is forced to "triton": kernel tests; an "auto" CPU run never takes the slow interpreter), a
supported dtype, no autograd (grad mode on and an input requiring grad) and outside `torch.compile`
tracing. Anything else runs the op's reference implementation (the same ATen ops as the subgraph it
replaced), so an unsupported case is slower, never different. The backend ("auto", "reference" or
"triton") is a setting of the run context (`rewrite.ops.run_context`): `use_backend` sets it for a block,
in this thread only.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor

from rewrite.ops import run_context

try:  # triton is a Linux-only dependency
    import triton  # noqa: F401
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None

BACKENDS = run_context.BACKENDS


def _interpreter_on() -> bool:
    knobs = getattr(triton, "knobs", None) if triton is not None else None
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


INTERPRETING = triton is not None and _interpreter_on()  # fixed at import, as triton.jit decides


def get_backend() -> str:
    """The backend of the run context here."""
    return run_context.current().backend


def set_backend(name: str) -> str:
    """"auto" (kernel where supported), "reference" (never the kernel) or "triton" (the kernel or an error), in
    this thread until set again or until an enclosing `use_backend` ends; returns the previous one."""
    return run_context.update(backend=name).backend


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Within the block, the backend `name` (in this thread only)."""
    with run_context.using(backend=name):
        yield


def conv_bias_is_separate(device: torch.device) -> bool:
    """Whether ATen's conv adds its bias with a separate `add_` (one rounding after the sum) on this device:
    its cuDNN path does (CUDA, cuDNN on: the Wan runtime keeps graphs off when it is not, see
    `rewrite.runtime.guards.cudnn_reason`). CPU convs (oneDNN) may fold the bias into the sum, and whether they
    do depends on the instruction set and the shape. Only where this holds may a kernel add a conv's bias
    after a bias-free conv, or a pattern defer it into a later kernel, and stay exact."""
    return device.type == "cuda"


def kernel_unsupported_reason(op: str, tensors: tuple[Tensor, ...], dtypes: tuple[torch.dtype, ...]) -> Optional[str]:
    """None when a Triton kernel may serve `op` for these tensors, else the reason."""
    if triton is None:
        return "triton is not importable"
    first = tensors[0]
    if not (first.is_cuda or (INTERPRETING and get_backend() == "triton" and first.device.type == "cpu")):
        return f"tensors are on {first.device} (kernels need CUDA, or CPU under TRITON_INTERPRET=1 when forced)"
    if any(t.device != first.device for t in tensors):
        return "tensors are on different devices"
    if first.dtype not in dtypes:
        return f"dtype {first.dtype} is not one of {dtypes}"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "autograd is needed (grad mode on and an input requires grad)"
    if torch.compiler.is_compiling():
        return "torch.compile is tracing"
    return None


def choose(op: str, unsupported_reason: Callable[[], Optional[str]]) -> tuple[str, Optional[str]]:
    """``("triton", None)`` or ``("reference", why)`` for `op` under the backend switch.

    `unsupported_reason()` (called unless the switch says "reference") is None when the kernel can serve
    the call. Raises ValueError when the backend is forced to "triton" and it cannot.
    """
    backend = get_backend()
    if backend == "reference":
        return "reference", "backend switch set to 'reference'"
    reason = unsupported_reason()
    if reason is None:
        return "triton", None
    if backend == "triton":
        raise ValueError(f"{op}: backend 'triton' forced but unsupported: {reason}")
    return "reference", reason


def use_kernel(op: str, tensors: tuple[Tensor, ...], dtypes: tuple[torch.dtype, ...]) -> bool:
    """Whether `op` runs its kernel now; raises when the "triton" backend is forced but unsupported."""
    return choose(op, lambda: kernel_unsupported_reason(op, tensors, dtypes))[0] == "triton"
