"""Compile a graph's Triton kernels in parallel before its first real run.

A decode graph launches dozens of distinct Triton kernel specializations (the AuK ``channels_last`` graph:
about 40 variants of the conv and activation kernels, each seconds of compiling on a cold cache), and an eager
run compiles them one after the other as it reaches them. Inside `compile_ahead`, the launches made through
`launch` only *submit* their compile to a thread pool (Triton's ``AsyncCompileMode``, which deduplicates
by Triton's own cache key) and run nothing; on exit the context waits for all of them. So a caller runs its
graph once inside the context (the outputs of those kernels are left uninitialized: the pass computes
nothing useful) and then for real. The compilers (LLVM, ptxas) release the GIL, so threads scale with the
cores. Each compile thread also builds its kernel's host launcher (`_build_launcher`): Triton before 3.9
compiles a C launcher per kernel signature with the host C compiler on a kernel's first launch (about 3.7 s
of the first Wan 2.1 720p decode on an empty Triton cache, one after the other); built here, in parallel, it
lands in Triton's cache and the first launch only loads it.

Every kernel of `rewrite.ops` is launched through `launch` (by `rewrite.kernels.launch.launch`). The pass
is a setting of the run context (`rewrite.ops.run_context`), so it covers the launches of the thread that
entered it only. Without Triton's ``AsyncCompileMode`` (older Triton), under the interpreter, or off CUDA,
the context does nothing and says so (it yields False).

`thread_launch_seconds()`: the seconds the calling thread has spent inside `launch` so far (cumulative:
compiles, loads from Triton's cache and the launches themselves), `thread_compile_ahead_seconds()` inside
active `compile_ahead` blocks (the pass and the wait for its compiles); the runtime reads them before and after
a capture to report what the kernels cost it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional

from rewrite.ops import run_context
from rewrite.ops.dispatch import INTERPRETING, triton

try:
    from triton.runtime._async_compile import AsyncCompileMode
except ImportError:  # pragma: no cover - Triton without async compilation
    AsyncCompileMode = None

logger = logging.getLogger(__name__)

__all__ = ["active", "available", "compile_ahead", "launch", "thread_compile_ahead_seconds", "thread_launch_seconds"]

_THREAD = threading.local()  # .seconds: time inside `launch`; .ahead: inside active `compile_ahead` (cumulative)


def available() -> bool:
    """Whether `compile_ahead` can compile in parallel here (Triton with AsyncCompileMode, not interpreting)."""
    return triton is not None and AsyncCompileMode is not None and not INTERPRETING


def active() -> bool:
    """Whether a `compile_ahead` pass is under way here (launches only compile: their outputs stay unwritten)."""
    return run_context.current().compile_ahead


def launch(kernel: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)``, or inside `compile_ahead` only its compile, submitted to the pool."""
    start = time.perf_counter()
    try:
        if run_context.current().compile_ahead:
            kernel.warmup(*args, grid=grid, **kwargs)
        else:
            kernel[grid](*args, **kwargs)
    finally:
        _THREAD.seconds = getattr(_THREAD, "seconds", 0.0) + time.perf_counter() - start


def _build_launcher(kernel: Any) -> Any:
    """Construct `kernel`'s host launcher once and drop it (Triton caches a compiled C launcher on disk by its
    source; the real launch constructs its own, from that cache). Only a speed-up: a failure is logged at
    debug level and the first launch builds the launcher as it always did."""
    try:
        from triton.runtime import driver

        driver.active.launcher_cls(kernel.src, kernel.metadata)
    except Exception as error:  # noqa: BLE001 - the launch builds it again and raises there if it must
        logger.debug("compile_ahead: building the launcher ahead failed (%s: %s)", type(error).__name__, error)
    return kernel


def _compile_mode(pool: ThreadPoolExecutor) -> Any:
    """Triton's AsyncCompileMode on `pool`, whose compile jobs also build the kernel's launcher."""
    mode = AsyncCompileMode(pool)
    submit = mode.submit

    def submit_and_build(key, compile_fn, *callbacks):
        return submit(key, lambda: _build_launcher(compile_fn()), *callbacks)

    mode.submit = submit_and_build
    return mode


def thread_launch_seconds() -> float:
    """Seconds the calling thread has spent inside `launch` so far (cumulative)."""
    return getattr(_THREAD, "seconds", 0.0)


def thread_compile_ahead_seconds() -> float:
    """Seconds the calling thread has spent inside active `compile_ahead` blocks so far (cumulative)."""
    return getattr(_THREAD, "ahead", 0.0)


@contextlib.contextmanager
def compile_ahead(workers: Optional[int] = None) -> Iterator[bool]:
    """Within: `launch` submits compiles instead of launching; on exit, wait for them. Yields whether it is
    active (False: run nothing inside, the launches would simply run). A compile that fails is logged and
    left to the real run, which compiles it again and raises there."""
    if not available() or active():
        yield False
        return
    workers = workers or min(32, os.cpu_count() or 1)
    start = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="triton-compile") as pool:
            mode = _compile_mode(pool)
            mode.__enter__()
            try:
                with run_context.using(compile_ahead=True):
                    yield True
            finally:
                try:
                    mode.__exit__(None, None, None)  # waits for every submitted compile
                except Exception as error:  # a failed compile: the real run compiles it again and raises there
                    logger.warning("compile_ahead: a kernel compile failed (%s: %s); it is compiled again on first "
                                   "use", type(error).__name__, error)
    finally:
        _THREAD.ahead = getattr(_THREAD, "ahead", 0.0) + time.perf_counter() - start
