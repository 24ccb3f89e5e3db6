"""What the model runners share: installation, concurrency, pickling, and capture against module changes.

A runner drives one optimized module. This base holds the parts that do not depend on the model:

* installation: `install(module)` sets the instance attributes the subclass names in `entry_points` as
  `functools.partial` objects (bound like methods, and picklable, unlike bound methods of functions the
  class does not have); `uninstall` removes them;
* concurrency: `lock` (`locks.ModuleLock`) serialises the decodes of this module and orders them across
  CUDA streams; captures run under `locks.CAPTURE_GATE` (`CaptureCache`, `graphs.StaticStep`);
* pickling: a runner pickles as a `PendingRunner` (its class, level, pass pipeline and options; graphs
  and CUDA graphs are never written), which `installed_runner` turns back into a runner on the module's first
  use after loading, so a loaded module is optimized as the pickled one was; ``copy.deepcopy`` copies the
  runner with its captured FX graphs (each runner's CUDA graphs refuse to be copied and start empty);
* capture against changes: `captured(key, listing, capture, what)` returns the graphs of `key`, captured
  again when the module tree changed since (`guards.ModuleSnapshot`: a module type, a non-tensor setting,
  a parameter set to None, ...), at most `MAX_RECAPTURES` times per key; then the reference path serves;
* what a capture does and costs: `capture_graphs` exports and rewrites a capture's graphs, or reads them
  back from the disk cache (`rewrite.runtime.disk_cache`, option ``cache_dir``), and records the seconds of
  each stage in `timings` (with the CUDA-graph builds that `cuda_graphs_built` receives), for the report;
* out of memory: `within_memory(attempt)` runs a decode's optimized path; a `torch.OutOfMemoryError` anywhere
  in it (a capture, a replay, a graph run eagerly) frees what the runner holds on the device
  (`release_device_memory`: CUDA graphs, their pools, static buffers, weight copies) and tries once more;
  out of memory again, it frees them again and returns None, and the caller runs the reference decode. Each
  step is noted in the report and logged. The caller sees an out-of-memory error only where the reference
  decode itself runs out.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import gc
import logging
import threading
import time
from typing import Any, Callable, Hashable, Iterator, Sequence

import torch
from torch import nn

from rewrite.capture.export import CapturedGraph
from rewrite.levels import LEVELS
from rewrite.reporting import FallbackLog, TimingLog
from rewrite.runtime import disk_cache, guards
from rewrite.runtime.captures import CaptureCache
from rewrite.runtime.graphs import BuildTiming, describe_key
from rewrite.runtime.locks import ModuleLock

logger = logging.getLogger("rewrite")

#: captures of one key after module changes before the reference path serves that key for good
MAX_RECAPTURES = 3
#: the reason the report gives for a decode that ran out of memory on the optimized path twice
OUT_OF_MEMORY_REASON = "out of GPU memory on the optimized path, twice (graphs freed in between)"
#: the levels at which an option of a runner can act (every level but "off")
EVERY_LEVEL: tuple[str, ...] = tuple(level for level in LEVELS if level != "off")


class DecoderRunner:
    """Base of `WanRunner` and `AuKRunner` (see the module docstring)."""

    model_name = "?"
    #: the keyword options of the runner's constructor that `optimize` passes on, by name: the levels at which
    #: each acts. `optimize` checks a call's option names against it (and `HIDDEN_OPTIONS`) before building
    #: anything, and names them in its TypeError for an option the runner does not take.
    OPTIONS: dict[str, tuple[str, ...]] = {"cache_dir": EVERY_LEVEL}
    #: keyword options the constructor takes that `optimize` accepts but does not list (test hooks)
    HIDDEN_OPTIONS: tuple[str, ...] = ()

    def __init__(self, level: str, rewrite_graph: Callable, options: dict[str, Any]) -> None:
        """`options` are the runner's normalised options; ``cache_dir`` (`disk_cache.open_cache`) is read here."""
        self.level = level
        self.rewrite_graph = rewrite_graph  # fn(CapturedGraph, level) applying the level's passes in place
        self.options = options
        self.disk_cache = disk_cache.open_cache(options.get("cache_dir"))
        self.timings = TimingLog()  # what the captures cost, per graph and stage (`report(...).first_call`)
        self.fallbacks = FallbackLog()
        self.graphs: CaptureCache = CaptureCache()  # per (dtype, device)
        self.snapshots: dict[Hashable, guards.ModuleSnapshot] = {}  # per key: the module tree as captured
        self.recaptures: collections.Counter = collections.Counter()
        self.lock = ModuleLock()
        self._serving = threading.local()  # .reference: this thread runs the reference decode for a call

    # ---- installation -------------------------------------------------------------------------------
    @classmethod
    def entry_points(cls, module: nn.Module) -> list[tuple[nn.Module, str, Callable]]:
        """(owner, attribute, function) triples: `install` sets ``owner.attribute = partial(function, owner)``
        and ``owner._rewrite_runner``; `uninstall` removes both."""
        raise NotImplementedError

    def install(self, module: nn.Module) -> None:
        for owner, name, function in self.entry_points(module):
            owner.__dict__[name] = functools.partial(function, owner)
            owner.__dict__["_rewrite_runner"] = self

    @classmethod
    def uninstall(cls, module: nn.Module) -> None:
        for owner, name, _ in cls.entry_points(module):
            owner.__dict__.pop(name, None)
            owner.__dict__.pop("_rewrite_runner", None)

    # ---- out of memory -------------------------------------------------------------------------------
    def release_device_memory(self) -> None:
        """Drop everything this runner holds on the device for speed (CUDA graphs and their pools, static
        buffers, weight copies); the FX graphs stay. Subclasses free their own containers."""

    def within_memory(self, attempt: Callable[[], Any]) -> Any:
        """`attempt()`, retried once after `release_device_memory` when it runs out of device memory; None when
        the retry runs out too (module docstring). Other errors propagate."""
        for retry in (False, True):
            try:
                return attempt()
            except torch.OutOfMemoryError as error:
                message = str(error).splitlines()[0] if str(error) else type(error).__name__
            self._free_after_out_of_memory()
            if not retry:
                self.fallbacks.note(f"out of GPU memory on the optimized path ({message}): its CUDA graphs and "
                                    "buffers freed, the decode tried again")
        return None

    def _free_after_out_of_memory(self) -> None:
        with self.lock.holding(torch.device("cpu")):  # no other call of this module replays while they go
            self.release_device_memory()
        gc.collect()  # the failed attempt's tensors, held by its traceback's frames until now
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    # ---- reference path -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def serving_reference(self) -> Iterator[None]:
        """While this thread runs the reference decode of a call: installed entry points it reaches again
        (Wan's decoder forward) go straight to the class code, counted once, as one reference call."""
        previous = getattr(self._serving, "reference", False)
        self._serving.reference = True
        try:
            yield
        finally:
            self._serving.reference = previous

    @property
    def in_reference(self) -> bool:
        return getattr(self._serving, "reference", False)

    # ---- capture ------------------------------------------------------------------------------------
    def captured(self, key: Hashable, listing: guards.Listing, capture: Callable[[], Any], what: str):
        """The graphs of `key` (None when their capture failed: `graphs.errors[key]` says why), captured on
        first use and again when the module tree in `listing` changed since (`forget_graphs` is called first)."""
        snapshot = self.snapshots.get(key)
        if snapshot is not None and key in self.graphs.values:
            changes = snapshot.changes(listing)
            if changes:
                self.recaptures[key] += 1
                self.graphs.forget(key)
                self.forget_graphs(key)
                if self.recaptures[key] > MAX_RECAPTURES:
                    self.graphs.errors[key] = (f"the decoder changed after {MAX_RECAPTURES} recaptures for {what} "
                                               f"({'; '.join(changes)}); the reference path serves it from now on")
                    return None
                logger.warning("the decoder changed since its capture for %s (%s); capturing again",
                               what, "; ".join(changes))
        if key not in self.graphs.values and key not in self.graphs.errors:
            self.snapshots[key] = guards.ModuleSnapshot.of(listing)
        return self.graphs.get(key, capture, what)

    def capture_graphs(self, export: Callable[[], Sequence[CapturedGraph]], *, key: Hashable, model: nn.Module,
                       root: nn.Module, names: Sequence[str], dtype: torch.dtype,
                       device: torch.device, size: Sequence[int] | None = None) -> tuple[CapturedGraph, ...]:
        """The rewritten graphs of one capture (for `captured`): read back from the disk cache when it holds them,
        else `export()`-ed, rewritten at the level and written to the cache. `model` is what the user optimized,
        `root` the module whose parameters the graphs name; `names` the graphs `export` returns; `size` the
        input size the graphs were exported for (None: symbolic sizes). Each stage's seconds go to `timings`
        (and the graphs' own ``timings``)."""
        entry_key, cache = None, self.disk_cache
        label = " " + describe_key((*(size or ()), dtype, device))
        if cache is not None:
            start = time.perf_counter()
            try:  # the cache only ever saves time: a failure in it is logged, and the capture runs
                if device.type == "cuda":
                    cache.load_verdicts(device)  # before any self-check of this device can run
                entry_key = disk_cache.graph_key(model_name=self.model_name, model=model, root=root,
                                                 snapshot=self.snapshots[key], graphs=names, dtype=dtype,
                                                 device=device, level=self.level, rewrite_graph=self.rewrite_graph,
                                                 size=size)
                loaded = None if entry_key is None else cache.load_graphs(entry_key, root)
            except Exception as error:  # noqa: BLE001
                cache.report_problem(f"reading failed ({type(error).__name__}: {error}); capturing")
                entry_key = loaded = None
            if loaded is not None:
                share = (time.perf_counter() - start) / len(loaded)
                for graph in loaded:
                    graph.timings = {"disk cache load": share}
                    graph.capture_seconds = share
                    self.timings.add(graph.name + label, "disk cache load", share)
                return tuple(loaded)
        graphs = tuple(export())
        for graph in graphs:
            self.timings.add(graph.name + label, "export", graph.timings.get("export", graph.capture_seconds))
            start = time.perf_counter()
            self.rewrite_graph(graph, self.level)
            graph.timings["passes"] = time.perf_counter() - start
            graph.capture_seconds = sum(graph.timings.values())
            self.timings.add(graph.name + label, "passes", graph.timings["passes"])
        if entry_key is not None:
            start = time.perf_counter()
            try:
                cache.save_graphs(entry_key, graphs)
            except Exception as error:  # noqa: BLE001 - see above
                cache.report_problem(f"writing failed ({type(error).__name__}: {error})")
            self.timings.add("+".join(names) + label, "disk cache save", time.perf_counter() - start)
        return graphs

    def cuda_graphs_built(self, timing: BuildTiming) -> None:
        """Called by the runner's CUDA-graph containers after each build: its stages go to `timings`, and the
        self-check verdicts it found to the disk cache."""
        for stage, seconds in timing.stages().items():
            self.timings.add(timing.label, stage, seconds)
        if self.disk_cache is not None:
            key = timing.key if isinstance(timing.key, tuple) else (timing.key,)
            for device in {part for part in key if isinstance(part, torch.device) and part.type == "cuda"}:
                try:
                    self.disk_cache.save_verdicts(device)
                except Exception as error:  # noqa: BLE001 - only a saving of time, never a failed decode
                    self.disk_cache.report_problem(f"writing self-check verdicts failed ({type(error).__name__}: "
                                                   f"{error})")

    def disk_cache_summary(self) -> str | None:
        return None if self.disk_cache is None else self.disk_cache.summary()

    def cuda_graph_counts(self) -> dict[str, int]:
        """For the report: how many CUDA graphs of which kind the runner holds."""
        return {}

    def graph_memory(self):
        """For the report: the CUDA-graph memory held per size (`rewrite.runtime.graph_memory.GraphMemoryReport`),
        or None where the runner does not account for it or captured nothing."""
        return None

    def graph_reports(self) -> list:
        raise NotImplementedError

    def forget_graphs(self, key: Hashable) -> None:
        """Drop what was derived from the graphs of `key` (CUDA graphs, accepted guard states)."""

    # ---- copies and pickles ---------------------------------------------------------------------------
    def __deepcopy__(self, memo: dict) -> "DecoderRunner":
        clone = type(self).__new__(type(self))
        memo[id(self)] = clone
        for name, value in self.__dict__.items():
            clone.__dict__[name] = threading.local() if name == "_serving" else copy.deepcopy(value, memo)
        return clone

    def __reduce__(self):
        return PendingRunner, (type(self), self.vae, self.level, self.rewrite_graph, self.options)


class PendingRunner:
    """A runner as it was pickled: rebuilt for its module by `installed_runner` on the module's first use
    (`module` is the optimized module itself, whichever of its owners is used first)."""

    def __init__(self, runner_class: type, module: nn.Module, level: str, rewrite_graph: Callable,
                 options: dict[str, Any]) -> None:
        self.runner_class, self.module, self.level = runner_class, module, level
        self.rewrite_graph, self.options = rewrite_graph, options

    def restore(self) -> DecoderRunner:
        module = self.module
        runner = self.runner_class(module, self.level, self.rewrite_graph, **self.options)
        runner.install(module)  # replaces every entry point and `_rewrite_runner` of the pickled runner
        logger.info("%s loaded from a pickle, optimized again at level %r", type(module).__name__, self.level)
        return runner


_RESTORE_LOCK = threading.Lock()


def installed_runner(module: nn.Module) -> DecoderRunner | None:
    """The runner installed on `module` (rebuilt first if the module was unpickled), or None."""
    runner = module.__dict__.get("_rewrite_runner")
    if isinstance(runner, PendingRunner):
        with _RESTORE_LOCK:
            runner = module.__dict__.get("_rewrite_runner")
            if isinstance(runner, PendingRunner):
                runner = runner.restore()
                runner = module.__dict__.get("_rewrite_runner")
    return runner
