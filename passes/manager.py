"""A small pass manager: passes declare ordering constraints; every pass is checked after it runs.

A pass is a documented function ``fn(gm, ctx) -> PassResult``. ``PassSpec(name, fn, after=(), before=())``
declares that it runs after / before the named passes; ``PassManager`` orders the specs by a stable
topological sort (declaration order wherever the constraints allow) and rejects a cycle or a constraint
that names an unknown pass. After each pass it lints the graph, recompiles the module and checks that every
``call_function`` node has ``meta['val']`` (ops that return nothing may have ``None``). Any failure is a
``PassError`` naming the failing pass and the passes already run, chained to the original exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import networkx as nx
import torch
import torch.fx as fx

from rewrite.levels import check_level


@dataclasses.dataclass
class PassResult:
    gm: fx.GraphModule
    changed: bool
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PassContext:
    """What every pass sees: the level, the graph's dtype and device, and a shared log and report."""

    level: str = "lossless"
    dtype: torch.dtype | None = None
    device: torch.device | str | None = None
    log: list[str] = dataclasses.field(default_factory=list)
    report: dict[str, Any] = dataclasses.field(default_factory=dict)  # pass name -> its stats
    # called by fuse_patterns with (pattern, MatchResult) before the matches are replaced (rewrite-debug)
    match_observer: Callable[[Any, Any], None] | None = None

    def __post_init__(self) -> None:
        check_level(self.level)


Pass = Callable[[fx.GraphModule, PassContext], PassResult]


@dataclasses.dataclass(frozen=True)
class PassSpec:
    name: str
    fn: Pass
    after: tuple[str, ...] = ()
    before: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "after", tuple(self.after))
        object.__setattr__(self, "before", tuple(self.before))
        if not (self.fn.__doc__ or "").strip():
            raise ValueError(f"pass {self.name!r}: {self.fn.__qualname__} needs a docstring "
                             "(what it matches or does, exactness, preconditions)")


class PassError(RuntimeError):
    """A pass failed (raised, or left the graph invalid); says which one and what ran before it."""

    def __init__(self, pass_name: str, passes_run: Sequence[str], message: str) -> None:
        self.pass_name = pass_name
        self.passes_run = tuple(passes_run)
        after = ", ".join(self.passes_run) if self.passes_run else "no other pass"
        super().__init__(f"pass {pass_name!r} failed (after {after}): {message}")


def missing_val(gm: fx.GraphModule) -> list[str]:
    """Names of ``call_function`` nodes without ``meta['val']`` (None allowed for ops returning nothing)."""
    offenders = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        returns_nothing = isinstance(node.target, torch._ops.OpOverload) and not node.target._schema.returns
        if "val" not in node.meta or (node.meta["val"] is None and not returns_nothing):
            offenders.append(node.name)
    return offenders


def _order(specs: Sequence[PassSpec]) -> list[PassSpec]:
    by_name = {s.name: s for s in specs}
    if len(by_name) != len(specs):
        raise ValueError(f"duplicate pass names in {[s.name for s in specs]}")
    deps = nx.DiGraph()
    deps.add_nodes_from(by_name)
    for spec in specs:
        for field, others in (("after", spec.after), ("before", spec.before)):
            for other in others:
                if other not in by_name:
                    raise ValueError(f"pass {spec.name!r} declares {field}={other!r}, but no pass of that "
                                     f"name is registered (known: {', '.join(by_name)})")
                deps.add_edge(*((other, spec.name) if field == "after" else (spec.name, other)))
    index = {name: i for i, name in enumerate(by_name)}
    try:
        names = list(nx.lexicographical_topological_sort(deps, key=index.__getitem__))
    except nx.NetworkXUnfeasible:
        cycle = [u for u, _ in nx.find_cycle(deps)]
        raise ValueError(f"pass ordering constraints form a cycle: {' -> '.join(cycle + cycle[:1])}") from None
    return [by_name[n] for n in names]


class PassManager:
    """Runs passes in constraint order, validating the graph after each."""

    def __init__(self, specs: Sequence[PassSpec]) -> None:
        self.specs = _order(list(specs))

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> list[tuple[str, PassResult]]:
        """Run every pass on ``gm``; return ``(name, result)`` per pass. The last result holds the final gm."""
        results: list[tuple[str, PassResult]] = []
        done: list[str] = []
        for spec in self.specs:
            try:
                result = spec.fn(gm, ctx)
                if not isinstance(result, PassResult):
                    raise TypeError(f"returned {type(result).__name__}, expected PassResult")
                gm = result.gm
                gm.graph.lint()
                gm.recompile()
            except Exception as error:
                raise PassError(spec.name, done, f"{type(error).__name__}: {error}") from error
            offenders = missing_val(gm)
            if offenders:
                raise PassError(spec.name, done, f"call_function nodes without meta['val']: {', '.join(offenders)}")
            ctx.log.append(f"{spec.name}: changed={result.changed} {result.stats}")
            ctx.report[spec.name] = result.stats
            results.append((spec.name, result))
            done.append(spec.name)
        return results
