"""Who may use what at the same time: captures against decodes (process-wide) and one decode per module.

Two rules keep concurrent callers exact (docs/design.md section 11):

* `CAPTURE_GATE`: a capture (``torch.export`` of a step graph, the passes and their self-checks, a CUDA
  graph's warm-up and capture) runs alone among everything that goes through `rewrite`. ``torch.export``
  switches cuDNN, MKL-DNN and NNPACK off process-wide while it traces (``_ignore_backend_decomps``), so a
  decode running meanwhile in another thread would pick other convolution kernels: a different answer from
  the reference, and a CUDA graph captured then would keep them. Decodes take the gate shared
  (`CaptureGate.running`), captures exclusively (`CaptureGate.capturing`). A thread already inside
  ``running`` that must capture (a new CUDA graph shape in the middle of a decode) gives its shared hold
  back while it captures and takes it again afterwards; that is safe because it still holds its module's
  `ModuleLock` (below), so nothing of that module changes meanwhile.
* `ModuleLock`: one decode of a module at a time (its CUDA graphs' static inputs, caches and outputs, and
  the runner's bookkeeping, are shared by every caller), ordered across CUDA streams: a caller's current
  stream waits for the work the previous holder queued on another stream before it touches those buffers
  (the lock alone orders the host, not the GPU queues).

Lock order, so that no two threads wait on each other: a module's `ModuleLock` first, then the gate.
Work outside `rewrite` in other threads is not covered: while a capture runs, ``torch.export``'s switches are
visible to it too (docs/design.md section 11.1).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch


class CaptureGate:
    """Shared holds for decodes, an exclusive hold for captures; waiting captures go first."""

    def __init__(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer: int | None = None  # thread ident holding the exclusive hold
        self._writer_depth = 0
        self._writers_waiting = 0
        self._local = threading.local()

    def _read_depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Held shared for the duration of a decode (re-entrant; free inside this thread's own capture)."""
        me = threading.get_ident()
        depth = self._read_depth()
        if depth == 0 and self._writer != me:
            with self._condition:
                while self._writer is not None or self._writers_waiting:
                    self._condition.wait()
                self._readers += 1
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0 and self._writer != me:
                with self._condition:
                    self._readers -= 1
                    if self._readers == 0:
                        self._condition.notify_all()

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Held exclusively while capturing (re-entrant). A shared hold of this thread is given back first."""
        me = threading.get_ident()
        if self._writer == me:
            self._writer_depth += 1
            try:
                yield
            finally:
                self._writer_depth -= 1
            return
        depth = self._read_depth()
        with self._condition:
            if depth:
                self._readers -= 1
                self._condition.notify_all()
            self._writers_waiting += 1
            try:
                while self._writer is not None or self._readers:
                    self._condition.wait()
            finally:
                self._writers_waiting -= 1
            self._writer, self._writer_depth = me, 1
        try:
            yield
        finally:
            with self._condition:
                self._writer, self._writer_depth = None, 0
                if depth:  # back to the shared hold this thread had (it was first in line with the gate free)
                    self._readers += 1
                self._condition.notify_all()


#: the process-wide gate between captures and decodes
CAPTURE_GATE = CaptureGate()


class ModuleLock:
    """One holder at a time (re-entrant), its CUDA work ordered after the previous holder's on every stream.

    `holding(device)`: on CUDA, the current stream first waits for an event recorded on the stream the
    last holder used (when that was another stream), and an event is recorded on the current stream when
    the hold ends, after everything the holder queued there. Waiting on an event costs the host a few
    microseconds and a single caller on one stream never waits.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._last: dict[torch.device, tuple[torch.cuda.Stream, torch.cuda.Event]] = {}
        self._depth = 0

    @contextlib.contextmanager
    def holding(self, device: torch.device) -> Iterator[None]:
        with self._lock:
            outermost = self._depth == 0
            self._depth += 1
            stream = None
            if outermost and device.type == "cuda":
                stream = torch.cuda.current_stream(device)
                last = self._last.get(device)
                if last is not None and last[0] != stream:
                    stream.wait_event(last[1])
            try:
                yield
            finally:
                self._depth -= 1
                if stream is not None:
                    last = self._last.get(device)
                    event = last[1] if last is not None else torch.cuda.Event()
                    event.record(stream)
                    self._last[device] = (stream, event)

    def __deepcopy__(self, memo: dict) -> "ModuleLock":
        """A new lock: a copied module is used independently of its original."""
        return ModuleLock()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
