"""The run context: the settings a caller gives the ops for a block of work, per thread (`contextvars`).

The ops read these settings when they run; the runtime, the tests and probes set them for the duration of
a ``with`` block, and leaving the block restores what was set before. One frozen `RunContext` holds them all:

============== ======================================================= ===========================================
setting        what the ops do with it                                 set by
============== ======================================================= ===========================================
backend        "auto": a kernel where `dispatch` allows it;            `dispatch.use_backend` / `set_backend`
               "reference": never; "triton": the kernel or an error    (tests, probes)
fused_norm     the one-kernel Wan RMS norm where ATen's summation      ``using(fused_norm=False)`` (A/B probes)
               order is reproduced (`layout.norm_plan`); else ATen's
               reduction and an epilogue kernel
triton_conv1d  the AuK activation + conv op may run the Triton conv    ``using(triton_conv1d=False)`` (probes,
               where `triton_conv1d.chosen` says so; else ATen's       tests)
packed_weights the `triton_conv1d.PackedWeightCache` the Triton convs  `triton_conv1d.packed_weight_cache`
               take their packed weights from (None: pack per call)    (the AuK runtime, per decode)
valid_frames   `ValidFrames`: kernels over a bucket window skip the    `valid_length.valid_frames`
               positions past the valid frames (None: skip nothing)    (the AuK runtime, per decode)
compile_ahead  launches only submit their compile (a compile-ahead     `compile_ahead.compile_ahead`
               pass: their outputs stay unwritten)                     (the AuK runtime, at warm-up)
routes         a set the ops add a line to (`note_route`) where they   `GraphMemory` (a size's capture: what
               take a route of another error class (a Winograd conv)   ``report()`` lists per size)
============== ======================================================= ===========================================

Scope: a `contextvars.ContextVar`. A thread starts from the defaults (Python gives a new thread an empty
context), so two threads decoding two models never see each other's settings, and asyncio tasks get a copy
of their creator's. To hand a worker thread the caller's settings, run it in ``contextvars.copy_context()``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any, Iterator, NamedTuple, Optional

from torch import Tensor

__all__ = ["RunContext", "ValidFrames", "current", "note_route", "update", "using"]

BACKENDS = ("auto", "reference", "triton")


class ValidFrames(NamedTuple):
    """A bucket window's valid length: `frames` (int32 [1] on the kernels' device, read when they run), the
    window's `bucket` frames and the `margin` frames the decoder's right context needs."""

    frames: Tensor
    bucket: int
    margin: int


@dataclasses.dataclass(frozen=True)
class RunContext:
    """The settings of the ops (module docstring); the defaults are what a plain call gets."""

    backend: str = "auto"
    fused_norm: bool = True
    triton_conv1d: bool = True
    packed_weights: Optional[Any] = None  # a rewrite.kernels.conv1d.conv1d.PackedWeightCache
    valid_frames: Optional[ValidFrames] = None
    compile_ahead: bool = False
    routes: Optional[set] = None  # of str: `note_route`

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; expected one of {BACKENDS}")


_CURRENT: contextvars.ContextVar[RunContext] = contextvars.ContextVar("rewrite_run_context", default=RunContext())


def current() -> RunContext:
    """The settings in force here (this thread, this task)."""
    return _CURRENT.get()


def note_route(line: str) -> None:
    """Record here that an op took a route of another error class than the direct convs' (`line` says which conv
    and how), where the caller collects them (the ``routes`` setting); nothing otherwise."""
    routes = _CURRENT.get().routes
    if routes is not None:
        routes.add(line)


def update(**changes: Any) -> RunContext:
    """Change settings here until changed again (or until an enclosing `using` block ends); returns the
    settings before. Prefer `using`."""
    previous = _CURRENT.get()
    _CURRENT.set(dataclasses.replace(previous, **changes))
    return previous


@contextlib.contextmanager
def using(**changes: Any) -> Iterator[RunContext]:
    """Within the block, the current settings with `changes` applied (here only: this thread, this task)."""
    token = _CURRENT.set(dataclasses.replace(_CURRENT.get(), **changes))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)
