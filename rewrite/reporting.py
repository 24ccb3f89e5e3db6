"""What `optimize` did to a module: captured graphs, matched patterns, fallbacks, the path of the last call."""

from __future__ import annotations

import collections
import dataclasses
import logging

logger = logging.getLogger("rewrite")


@dataclasses.dataclass
class GraphReport:
    name: str
    dtype: str
    device: str
    nodes: int
    capture_seconds: float
    matches: dict[str, int]
    passes: list[str]

    @classmethod
    def of(cls, graph) -> "GraphReport":
        """The report row of a `CapturedGraph`."""
        return cls(graph.name, str(graph.dtype), str(graph.device), graph.node_count, graph.capture_seconds,
                   dict(graph.matches), list(graph.passes))


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

    def __str__(self) -> str:
        lines = [f"{self.model} at level {self.level!r}; last call: {self.last_path}"
                 + (f" ({self.last_reason})" if self.last_reason else "")
                 + (f": {self.last_detail}" if self.last_detail else "")]
        if self.graphs:
            lines.append(f"  {'graph':<8} {'dtype':<15} {'device':<8} {'nodes':>6} {'capture s':>9}  matches")
            for g in self.graphs:
                matches = ", ".join(f"{k}={v}" for k, v in sorted(g.matches.items()) if v) or "-"
                lines.append(f"  {g.name:<8} {g.dtype:<15} {g.device:<8} {g.nodes:>6} {g.capture_seconds:>9.2f}  {matches}")
        else:
            lines.append("  no graphs captured yet")
        if self.cuda_graphs:
            lines.append("  " + ", ".join(f"{k}: {v}" for k, v in self.cuda_graphs.items()))
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
        (logger.warning if first else logger.debug)("rewrite: %s", reason)

    def took_reference(self, reason: str) -> None:
        first = reason not in self.counts
        self.counts[reason] += 1
        self.last_path, self.last_reason, self.last_detail = "reference", reason, None
        (logger.warning if first else logger.debug)("rewrite: reference path taken: %s", reason)


@dataclasses.dataclass
class WarmupResult:
    """What `rewrite.warmup` did: the CUDA-graph shapes it captured (the model's own sizes: Wan (batch,
    latent height, latent width), AuK (batch, latent frames)), the seconds it took, and a note when it
    captured less than a later decode needs."""

    shapes: list[tuple[int, ...]]
    seconds: float
    note: str | None = None
