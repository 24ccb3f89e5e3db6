"""An opt-in on-disk cache of the captures' products that another process can reuse (docs/design.md section 8.6).

On with ``optimize(vae, cache_dir=DIR)`` or the environment variable ``REWRITE_CACHE_DIR=DIR`` (the option wins;
``cache_dir=False`` turns it off whatever the environment says). Two kinds of entries, one JSON file each:

* ``graphs-<model>-<key hash>.json``: the rewritten step graphs of one capture (Wan: chunk0 and steady; AuK:
  decode) after the level's passes, as `rewrite.capture.graph_file` writes them: nodes, targets, arguments and
  the names of the parameters and buffers the graphs read. No tensor is written (weights are read from the live
  module by name on every call, as for a fresh capture). A hit skips the export and the passes.
* ``selfchecks-<key hash>.json``: the per-shape verdicts of `rewrite.ops.selftest` for one kind of GPU and
  software stack, so that a new process skips the conv and SiLU self-checks it already ran.

Keys (`graph_key`, `selfcheck_key`) hold everything that could change an entry: the format, the torch, CUDA,
cuDNN, Triton, diffusers and Python versions, the project's version and a hash of its source files (passes and
patterns included), the device (its name, e.g. ``NVIDIA H200``, compute capability and SM count; ``cpu``), and
for graphs the model class and a hash of its source file, its config, the module tree as the capture saw it
(types, children, plain settings: `guards.ModuleSnapshot`), every parameter's and buffer's name, shape, strides
and dtype (not its values), the graphs' dtype and export size ("symbolic" or the size), the level, the capture
kind and the pass pipeline. The file name holds the key's hash and the file the key itself, compared in full on
load.

Trust: an entry is used only when it parses, its checksum matches its payload, its key is the expected key and
its graphs rebuild and read parameters the module has. Anything else (truncated, corrupt, stale, unreadable) is
logged at WARNING with the reason and ignored, and the capture runs and writes the entry again. Writes go to a
temporary file in the same directory, then `os.replace`: concurrent processes writing one entry leave one
complete entry. Self-check verdicts are merged with what the file holds before writing; two processes merging
at once may drop each other's new verdicts (they are then checked again), never corrupt the file. Entries are
JSON (no pickle), yet they decide which ops run: keep the directory writable by trusted users only, as for
Triton's or Inductor's caches. Nothing is evicted: delete the directory to reclaim its space.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import os
import pathlib
import sys
import tempfile
import threading
from typing import Any, Callable, Sequence

import torch
from torch import nn

from rewrite.capture import graph_file
from rewrite.capture.export import CapturedGraph
from rewrite.ops import selftest

logger = logging.getLogger("rewrite")

ENV_VAR = "REWRITE_CACHE_DIR"
#: layout of the entry files; part of every key
FORMAT = 1
_MAGIC = "rewrite-disk-cache"


def open_cache(option: Any) -> "DiskCache | None":
    """The cache `optimize`'s ``cache_dir`` option names: a directory path; None for ``REWRITE_CACHE_DIR`` (off when
    unset or empty); False for off. TypeError for anything else."""
    if option is False:
        return None
    if option is None:
        option = os.environ.get(ENV_VAR) or None
        if option is None:
            return None
    elif isinstance(option, bool) or not isinstance(option, (str, os.PathLike)):
        raise TypeError(f"cache_dir must be a directory path (str or os.PathLike), None (the {ENV_VAR} environment "
                        f"variable) or False (off); got {option!r}")
    path = os.fspath(option)
    if not path:
        raise ValueError(f"cache_dir must be a directory path, None or False; got {option!r}")
    return DiskCache(pathlib.Path(path).expanduser())


def cache_dir_option(option: Any) -> Any:
    """The ``cache_dir`` option as a runner records it (validated; a path as a str), so that two `optimize` calls
    naming one directory compare equal."""
    open_cache(option if option is not None else False)  # validates without reading the environment
    return os.fspath(option) if isinstance(option, os.PathLike) else option


@dataclasses.dataclass
class CacheStats:
    graphs_loaded: int = 0
    graphs_stored: int = 0
    verdicts_loaded: int = 0
    verdicts_stored: int = 0
    rejected: int = 0  # entries ignored (truncated, corrupt, stale, unreadable) or not written
    last_problem: str | None = None


class DiskCache:
    """One cache directory (created on first write) as one runner uses it: the counts are that runner's (the
    report's), the files everyone's. Thread-safe."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._verdict_counts: dict[str, int] = {}  # verdict file name -> records it held when last read or written

    def __deepcopy__(self, memo: dict) -> "DiskCache":
        return self  # a copied model uses the same directory (and counts with its original)

    def __repr__(self) -> str:
        return f"DiskCache({str(self.root)!r})"

    def summary(self) -> str:
        """For the report: the directory and what it served in this process."""
        s = self.stats
        text = (f"{self.root}: graphs {s.graphs_loaded} loaded, {s.graphs_stored} stored; self-check verdicts "
                f"{s.verdicts_loaded} loaded, {s.verdicts_stored} stored")
        if s.rejected:
            text += f"; {s.rejected} entries ignored or not written (last: {s.last_problem})"
        return text

    # ---- graphs ---------------------------------------------------------------------------------------------
    def load_graphs(self, key: dict, root: nn.Module) -> list[CapturedGraph] | None:
        """The graphs stored under `key`, or None (a miss, or an entry not trusted: logged)."""
        path = self._path("graphs", key)
        payload = self._read(path, key)
        if payload is None:
            return None
        try:
            graphs = [graph_file.decode(data) for data in payload["graphs"]]
            if [g.name for g in graphs] != list(key["graphs"]):
                raise graph_file.GraphFileError(f"graphs {[g.name for g in graphs]}, expected {key['graphs']}")
            names = {name for name, _ in root.named_parameters()} | {name for name, _ in root.named_buffers()}
            missing = sorted({t for g in graphs for kind, t in g.input_kinds if kind in ("param", "buffer")} - names)
            if missing:
                raise graph_file.GraphFileError(f"the graphs read {missing[:3]}, which the module does not have")
        except (graph_file.GraphFileError, KeyError, TypeError) as error:
            self.report_problem(f"ignoring {path.name}: stale or corrupt graphs ({error}); capturing again")
            return None
        with self._lock:
            self.stats.graphs_loaded += len(graphs)
        logger.info("disk cache: %s graphs read from %s", "+".join(key["graphs"]), path)
        return graphs

    def save_graphs(self, key: dict, graphs: Sequence[CapturedGraph]) -> bool:
        """Write `graphs` under `key`; False (logged) when they cannot be written as data or the write failed."""
        try:
            payload = {"graphs": [graph_file.encode(g) for g in graphs]}
        except graph_file.GraphFileError as error:
            self.report_problem(f"not writing {'+'.join(key['graphs'])} to the disk cache: {error}")
            return False
        if not self._write(self._path("graphs", key), key, payload):
            return False
        with self._lock:
            self.stats.graphs_stored += len(graphs)
        return True

    # ---- self-check verdicts --------------------------------------------------------------------------------
    def load_verdicts(self, device: torch.device) -> int:
        """Adopt the stored verdicts for `device` (`selftest.adopt`); returns how many were new here."""
        key = selfcheck_key(device)
        path = self._path("selfchecks", key)
        payload = self._read(path, key)
        if payload is None:
            return 0
        try:
            adopted = selftest.adopt(device, payload["verdicts"])
        except (KeyError, TypeError, ValueError) as error:
            self.report_problem(f"ignoring {path.name}: corrupt self-check verdicts ({error})")
            return 0
        with self._lock:
            self.stats.verdicts_loaded += adopted
            self._verdict_counts[path.name] = max(self._verdict_counts.get(path.name, 0), len(payload["verdicts"]))
        return adopted

    def save_verdicts(self, device: torch.device) -> int:
        """Write this process's verdicts for `device`, merged with the file's, when there are new ones; returns
        how many records the file now holds (0 when nothing was written)."""
        found = selftest.verdicts(device)
        key = selfcheck_key(device)
        path = self._path("selfchecks", key)
        with self._lock:
            if len(found) <= self._verdict_counts.get(path.name, 0):
                return 0
        stored = self._read(path, key)
        records = {json.dumps(r, sort_keys=True): r for r in (stored or {}).get("verdicts", []) if isinstance(r, dict)}
        before = len(records)
        records.update((json.dumps(r, sort_keys=True), r) for r in found)
        if len(records) == before:
            with self._lock:
                self._verdict_counts[path.name] = len(found)
            return 0
        if not self._write(path, key, {"verdicts": list(records.values())}):
            return 0
        with self._lock:
            self.stats.verdicts_stored += len(records) - before
            self._verdict_counts[path.name] = len(records)
        return len(records)

    # ---- files ----------------------------------------------------------------------------------------------
    def _path(self, kind: str, key: dict) -> pathlib.Path:
        label = f"{kind}-{key['model']}" if kind == "graphs" else kind
        return self.root / f"{label}-{key_hash(key)[:32]}.json"

    def _read(self, path: pathlib.Path, key: dict) -> dict | None:
        """The payload of the entry at `path`, or None: missing (silently) or not trusted (logged)."""
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as error:
            self.report_problem(f"cannot read {path}: {error}")
            return None
        try:
            entry = json.loads(raw)
            if not isinstance(entry, dict) or entry.get("magic") != _MAGIC or entry.get("format") != FORMAT:
                raise ValueError("not an entry of this format")
            payload = entry["payload"]
            if entry.get("sha256") != _digest(payload):
                raise ValueError("checksum mismatch")
        except (ValueError, KeyError) as error:  # json.JSONDecodeError is a ValueError
            self.report_problem(f"ignoring {path.name}: truncated or corrupt ({type(error).__name__}: {error}); "
                          "it is rebuilt")
            return None
        if entry.get("key") != key:
            stored = entry.get("key") if isinstance(entry.get("key"), dict) else {}
            differing = sorted(k for k in set(stored) | set(key) if stored.get(k) != key.get(k))
            self.report_problem(f"ignoring {path.name}: stale (its key differs in {differing[:5]}); it is rebuilt")
            return None
        return payload

    def _write(self, path: pathlib.Path, key: dict, payload: dict) -> bool:
        entry = {"magic": _MAGIC, "format": FORMAT, "key": key, "sha256": _digest(payload), "payload": payload}
        data = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()
        temporary = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(dir=self.root, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.replace(temporary, path)  # atomic: readers see the old entry or the new one, never a part
            temporary = None
        except OSError as error:
            self.report_problem(f"cannot write {path}: {error}")
            return False
        finally:
            if temporary is not None:
                with contextlib.suppress(OSError):  # a leftover temporary file is only clutter
                    os.unlink(temporary)
        logger.debug("disk cache: wrote %s (%d bytes)", path, len(data))
        return True

    def report_problem(self, message: str) -> None:
        """Log `message` at WARNING and count it (an entry ignored or not written)."""
        with self._lock:
            self.stats.rejected += 1
            self.stats.last_problem = message
        logger.warning("disk cache: %s", message)


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def key_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ---- keys ---------------------------------------------------------------------------------------------------
def graph_key(*, model_name: str, model: nn.Module, root: nn.Module, snapshot, graphs: Sequence[str],
              dtype: torch.dtype, device: torch.device, level: str, rewrite_graph: Callable,
              size: Sequence[int] | None = None) -> dict | None:
    """The key of one capture's graphs, or None when it cannot be keyed (a pass pipeline that is not a named
    module-level function: nothing would tell two of them apart). `size`: the input size the graphs were
    exported for, None for symbolic sizes."""
    pipeline = f"{getattr(rewrite_graph, '__module__', '?')}.{getattr(rewrite_graph, '__qualname__', '?')}"
    if "<" in pipeline or "?" in pipeline:
        return None
    tensors = [[name, list(t.shape), list(t.stride()), str(t.dtype), bool(t.requires_grad)]
               for kind in ("parameters", "buffers")
               for name, t in getattr(root, f"named_{kind}")() if t is not None]
    modules = [[name, _qualified(shape.type), list(shape.children), list(shape.parameters), list(shape.buffers),
                sorted((k, _canonical(v)) for k, v in shape.settings.items())] for name, shape in snapshot.entries.items()]
    config = getattr(model, "config", None)
    if isinstance(config, dict):  # diffusers' FrozenDict, without its bookkeeping ("_use_default_values": a set's order)
        config = {k: _canonical(v) for k, v in config.items() if not k.startswith("_")}
    elif dataclasses.is_dataclass(config):  # AuKConfig
        config = _canonical(dataclasses.asdict(config))
    return {
        "format": [FORMAT, graph_file.FORMAT], "model": model_name, "graphs": list(graphs), "level": level,
        "size": "symbolic" if size is None else [int(n) for n in size],
        "dtype": str(dtype), "pipeline": pipeline, **environment(device),
        "model_class": _qualified(type(model)), "model_source": _source_hash(type(model)),
        "config": _hash(config), "modules": _hash(modules), "tensors": _hash(tensors),
    }


def selfcheck_key(device: torch.device) -> dict:
    """The key of the self-check verdicts of one kind of device and software stack (any index of that kind)."""
    return {"format": [FORMAT], "model": "selfchecks", **environment(device), "device": device.type}


def environment(device: torch.device) -> dict:
    """The software and device part of every key (the device with its index: a graph may name it)."""
    key = {"versions": _versions(), "code": project_hash(), "device": str(device)}
    if device.type == "cuda":
        key.update(_cuda_device(torch.device(device)))
    else:
        key["device_name"] = device.type
    return key


@functools.lru_cache(maxsize=None)
def _cuda_device(device: torch.device) -> dict:
    props = torch.cuda.get_device_properties(device)
    return {"device_name": props.name, "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count, "cudnn": torch.backends.cudnn.version()}


@functools.lru_cache(maxsize=None)
def _versions() -> dict:
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    for package in ("triton", "diffusers", "vae-rewrite"):  # from the package metadata: importing diffusers costs
        try:                                                 # seconds, and an AuK process never needs it
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:  # e.g. run from a source tree: the code hash still counts
            versions[package] = None
    return versions


@functools.lru_cache(maxsize=None)
def project_hash() -> str:
    """sha256 of the project's Python sources (`rewrite` with its passes and patterns), names and contents."""
    digest = hashlib.sha256()
    for package, recursive in (("rewrite", True), ("rewrite.passes", False), ("rewrite.patterns", False)):
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            root = pathlib.Path(location)
            for path in sorted(root.rglob("*.py") if recursive else root.glob("*.py")):
                digest.update(f"{package}/{path.relative_to(root).as_posix()}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def _source_hash(cls: type) -> str | None:
    try:
        return hashlib.sha256(pathlib.Path(inspect.getsourcefile(cls)).read_bytes()).hexdigest()
    except (TypeError, OSError):
        return None


def _canonical(value: Any) -> Any:
    """`value` as JSON data that is the same in every process (sets sorted; anything else unknown as its repr)."""
    if isinstance(value, (bool, int, str)) or value is None:
        return value
    if isinstance(value, float):
        return repr(value)  # inf and nan too
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda item: repr(item[0]))}
    return repr(value)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()

