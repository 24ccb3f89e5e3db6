"""What `optimize` did to a module: captured graphs, matched patterns, fallbacks, the path of the last call, and
what the first calls cost (`Timing` records: export, passes, self-checks, kernels, CUDA-graph capture).

A graph's size is given in tensor ops (`op_count`: call nodes, not the weight and input placeholders nor the
shape arithmetic of symbolic sizes), the count ``rewrite-debug`` prints too."""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rewrite.runtime.graph_memory import GraphMemoryReport

logger = logging.getLogger("rewrite")


#: the stages of first-call work a `Timing` names, in the order they happen
STAGES = (
    "export",  # torch.export of a step graph
    "passes",  # the level's passes over it
    "disk cache load",  # the rewritten graphs read back from the disk cache instead of the two above
    "disk cache save",
    "compile ahead",  # Triton kernels compiled in parallel before a capture (warmup)
    "self-checks",  # per-shape conv and SiLU self-checks (`rewrite.ops.selftest`), inside the warm-up
    "kernel launches",  # time inside Triton launches during the warm-up and capture: compiles, cache loads
    "warm-up",  # the eager runs before a CUDA-graph capture (self-checks and kernel launches included)
    "capture",  # the CUDA-graph captures themselves
)


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of one stage of first-call work for one graph: an FX graph ("chunk0", "steady", "decode") or the
    CUDA graphs of one shape ("CUDA graphs 1x60x104 torch.bfloat16 cuda:0"). Stages in `STAGES`."""

    graph: str
    stage: str
    seconds: float


class TimingLog:
    """`Timing` records in the order they were added, from any thread (a lock around the lists). Bounded: the
    first `keep` records (the first calls) and the last `keep` are kept, those between are dropped (a server
    that keeps recapturing evicted shapes would otherwise grow it for ever)."""

    def __init__(self, records: list[Timing] | None = None, keep: int = 512) -> None:
        self._lock = threading.Lock()
        self._keep = keep
        self._first: list[Timing] = []
        self._recent: collections.deque[tuple[int, Timing]] = collections.deque(maxlen=keep)
        self._added = 0
        for record in records or []:
            self._append(record)

    def _append(self, record: Timing) -> None:
        if self._added < self._keep:
            self._first.append(record)
        else:
            self._recent.append((self._added, record))
        self._added += 1

    def add(self, graph: str, stage: str, seconds: float) -> None:
        with self._lock:
            self._append(Timing(graph, stage, max(0.0, float(seconds))))

    def records(self, since: int = 0) -> list[Timing]:
        """The records kept, from the `since`-th added on (`since`: `len(log)` taken earlier)."""
        with self._lock:
            return self._first[since:] + [record for index, record in self._recent if index >= since]

    def __len__(self) -> int:
        """How many records were added (kept or not)."""
        with self._lock:
            return self._added

    def __deepcopy__(self, memo: dict) -> "TimingLog":
        return TimingLog(self.records(), self._keep)


def format_timings(records: list[Timing], indent: str = "  ") -> list[str]:
    """One line per graph: its stages and seconds, in `STAGES` order (repeated stages summed)."""
    by_graph: dict[str, collections.Counter] = {}
    for record in records:
        by_graph.setdefault(record.graph, collections.Counter())[record.stage] += record.seconds
    width = max((len(name) for name in by_graph), default=0)
    lines = []
    for name, stages in by_graph.items():
        parts = [f"{stage} {stages[stage]:.2f}" for stage in STAGES if stage in stages]
        parts += [f"{stage} {seconds:.2f}" for stage, seconds in stages.items() if stage not in STAGES]
        lines.append(f"{indent}{name:<{width}}  " + ", ".join(parts))
    return lines


def is_shape_arithmetic(node: torch.fx.Node) -> bool:
    """Whether an FX call node computes a size, not a tensor (``aten.sym_size.int``, ``operator.mul`` of sizes):
    its value is an int, float or bool, or a symbolic one. Graphs exported with symbolic sizes have such nodes;
    the same graphs exported for one size compute the sizes at export time and have none."""
    import torch

    value = node.meta.get("val")
    return isinstance(value, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool))


def op_count(graph: torch.fx.Graph) -> int:
    """The tensor ops of an FX graph: its ``call_function`` nodes but shape arithmetic (`is_shape_arithmetic`).
    Placeholders (the weights and the inputs) and the output node are not counted, so a graph exported for one
    size and the same graph with symbolic sizes count the same; `report` and ``rewrite-debug`` both count so."""
    return sum(1 for node in graph.nodes if node.op == "call_function" and not is_shape_arithmetic(node))


@dataclasses.dataclass
class GraphReport:
    name: str
    dtype: str
    device: str
    nodes: int  # every node of the rewritten graph: placeholders (weights, inputs), ops, shape arithmetic, output
    capture_seconds: float
    matches: dict[str, int]
    passes: list[str]
    source: str = "export"  # "export" or "disk cache"
    #: pattern family -> guard reason -> candidates declined (where a node kept the op of a lower level)
    declined: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    #: the input sizes the graph serves: "any" (sizes symbolic) or one size, e.g. "1x90x160" (Wan's first sizes)
    sizes: str = "any"
    #: the tensor ops of the rewritten graph (`op_count`), the count the report prints; None when unknown
    ops: int | None = None

    @classmethod
    def of(cls, graph) -> "GraphReport":
        """The report row of a `CapturedGraph`."""
        return cls(graph.name, str(graph.dtype), str(graph.device), graph.node_count, graph.capture_seconds,
                   dict(graph.matches), list(graph.passes),
                   "disk cache" if "disk cache load" in graph.timings else "export",
                   {family: dict(reasons) for family, reasons in graph.declined.items()},
                   ops=op_count(graph.graph_module.graph))


@dataclasses.dataclass
class Report:
    model: str
    level: str
    graphs: list[GraphReport]
    fallbacks: dict[str, int]  # reason -> how many calls took the reference path for it
    last_path: str  # "graphs", "reference" or "none" (not called yet)
    last_reason: str | None
    last_detail: str | None = None  # how the graphs served the last call (e.g. "CUDA graph, bucket 320")
    cuda_graphs: dict[str, int] = dataclasses.field(default_factory=dict)  # runner's CUDA graph counts
    #: the CUDA-graph memory held, per size and in total (`rewrite.runtime.graph_memory.GraphMemoryReport`;
    #: Wan), None where not accounted or nothing was captured
    graph_memory: GraphMemoryReport | None = None
    #: what the captures cost so far, per graph and stage (the first call's breakdown, and each new shape's)
    first_call: list[Timing] = dataclasses.field(default_factory=list)
    disk_cache: str | None = None  # where the disk cache is and what it served, None when it is off
    #: the sharded decode's band graphs of this module, one line each (`rewrite.models.wan.distributed.band_graphs.describe`)
    band_graphs: list[str] = dataclasses.field(default_factory=list)

    @property
    def first_call_seconds(self) -> float:
        """The seconds of every `first_call` record but the parts of the warm-up listed apart (no double count)."""
        return sum(t.seconds for t in self.first_call if t.stage not in ("self-checks", "kernel launches"))

    def __str__(self) -> str:
        lines = [f"{self.model} at level {self.level!r}; last call: {self.last_path}"
                 + (f" ({self.last_reason})" if self.last_reason else "")
                 + (f": {self.last_detail}" if self.last_detail else "")]
        if self.graphs:
            width = max(8, *(len(g.name) for g in self.graphs))  # an encoder's graph names are longer
            lines.append(f"  {'graph':<{width}} {'dtype':<15} {'device':<8} {'sizes':<10} {'ops':>6} "
                         f"{'capture s':>9}  matches")
            for g in self.graphs:
                matches = ", ".join(f"{k}={v}" for k, v in sorted(g.matches.items()) if v) or "-"
                ops = "?" if g.ops is None else g.ops
                lines.append(f"  {g.name:<{width}} {g.dtype:<15} {g.device:<8} {g.sizes:<10} {ops:>6} "
                             f"{g.capture_seconds:>9.2f}  {matches}")
                for family, reasons in sorted(g.declined.items()):
                    for reason, count in sorted(reasons.items()):
                        lines.append(f"    declined x{count} by {family}: {reason}")
        else:
            lines.append("  no graphs captured yet")
        if self.cuda_graphs:
            lines.append("  " + ", ".join(f"{k}: {v}" for k, v in self.cuda_graphs.items()))
        if self.graph_memory is not None:
            lines.extend("  " + line for line in self.graph_memory.lines())
        if self.first_call:
            lines.append(f"  first-call work: {self.first_call_seconds:.2f} s (self-checks and kernel launches are "
                         "parts of the warm-up)")
            lines.extend(format_timings(self.first_call, indent="    "))
        if self.disk_cache:
            lines.append(f"  disk cache: {self.disk_cache}")
        if self.band_graphs:
            lines.append("  band graphs of the sharded decode (docs/distributed.md):")
            lines.extend(f"    {line}" for line in self.band_graphs)
        for reason, count in self.fallbacks.items():
            lines.append(f"  fallback x{count}: {reason}")
        return "\n".join(lines)


class FallbackLog:
    """Counts reference-path calls per reason; logs each distinct reason once at WARNING, then at DEBUG."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.last_path = "none"
        self.last_reason: str | None = None
        self.last_detail: str | None = None

    def took_graphs(self, detail: str | None = None) -> None:
        self.last_path, self.last_reason, self.last_detail = "graphs", None, detail

    def note(self, reason: str) -> None:
        """A degradation that still computes the exact result (e.g. graphs run without CUDA graphs)."""
        first = reason not in self.counts
        self.counts[reason] += 1
        (logger.warning if first else logger.debug)("%s", reason)

    def took_reference(self, reason: str) -> None:
        first = reason not in self.counts
        self.counts[reason] += 1
        self.last_path, self.last_reason, self.last_detail = "reference", reason, None
        (logger.warning if first else logger.debug)("reference path taken: %s", reason)


@dataclasses.dataclass
class WarmupResult:
    """What `rewrite.warmup` did: the CUDA-graph shapes it captured (the model's own sizes: Wan (batch,
    latent height, latent width), AuK (batch, latent frames)), the seconds it took, and a note when it
    captured less than a later decode needs."""

    shapes: list[tuple[int, ...]]
    seconds: float
    note: str | None = None
    breakdown: list[Timing] = dataclasses.field(default_factory=list)  # what this warm-up's captures cost

    def __str__(self) -> str:
        lines = [f"warmup: {len(self.shapes)} shape(s) {self.shapes} in {self.seconds:.2f} s"
                 + (f" ({self.note})" if self.note else "")]
        return "\n".join(lines + format_timings(self.breakdown))
