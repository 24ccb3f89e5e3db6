"""Patterns: a search function, a replacement, a guard, an exactness class and a minimum level.

A pattern is pure graph data. ``search`` is a small function written with ``torch.ops.aten.*`` calls, so
a reader sees the math; ``replace`` has the same parameters and calls a custom op. Both are traced once
(lazily, cached on the pattern) into ``torch.fx`` graphs with one placeholder per parameter:

* a parameter named in ``scalars`` is a *literal placeholder*: it matches any literal at its position
  (number, bool, list/tuple of ints, dtype, None) and binds its value (e.g. the per-layer ``sqrt(C)``);
* every other parameter matches a graph node (a tensor input of the subgraph);
* a parameter annotated with a `typing.NamedTuple` class (an op's arguments that travel together, such as
  `rewrite.models.wan.ops.ConvStage`) stands for one placeholder per field, named by the field plus the
  parameter name's trailing digits (``stage2: ConvStage`` -> ``gamma2``, ..., ``bias2``, so two stages of one
  pattern bind distinct names), and the function receives the tuple of them; fields not typed as tensors
  (``Tensor`` or ``Optional[Tensor]``) are literal placeholders.

``variants(...)`` generates the family of patterns a file needs instead of pasting copies: one pattern
per value of each keyword axis (``act=("silu", None)`` passes ``act=...`` to ``search`` and
``replace``), and per op site, the in-place overload (``add`` -> ``add_``) and commuted operands of the
commutative ops ``add``/``mul``. Such site variants are graph edits on the traced search graph, recorded
in ``Pattern.edits``.

Exactness is ``"exact"`` (``torch.equal`` with the replaced ops) or ``"tolerance"`` (documented bound);
``level`` is the lowest level that enables the pattern (``rewrite.levels``). This module imports no model.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import operator
import re
import sys
import typing
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from rewrite.levels import check_level

if TYPE_CHECKING:
    from rewrite.engine.matcher import Match

EXACTNESS = ("exact", "tolerance")
SCALAR_META = "rewrite_literal_placeholder"  # placeholder meta flag: matches literals, not nodes
COMMUTATIVE = ("aten::add.Tensor", "aten::mul.Tensor")

Guard = Callable[["Match"], "str | None"]


# --------------------------------------------------------------------------------------------- tracing


def _op_name(op: torch._ops.OpOverload) -> str:
    return f"{op._schema.name}.{op._schema.overload_name or 'default'}"


def _as_overload(target: Any) -> Any:
    """An ``OpOverloadPacket`` (``torch.ops.ns.op``) with a single overload becomes that overload."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        overloads = target.overloads()
        if len(overloads) != 1:
            raise ValueError(f"{target} has overloads {overloads}: call one explicitly, e.g. {target}.{overloads[0]}")
        return getattr(target, overloads[0])
    return target


def trace(fn: Callable[..., Any], params: Sequence[str], scalars: Collection[str],
          kwargs: Mapping[str, Any]) -> fx.Graph:
    """Trace ``fn(*params, **kwargs)`` into an fx graph of ``call_function`` nodes.

    Each name in ``params`` becomes a placeholder; those in ``scalars`` carry ``meta[SCALAR_META]``.
    The output node always returns a tuple (one entry per returned value).
    """
    graph = fx.Graph()
    tracer = fx.proxy.GraphAppendingTracer(graph)
    proxies = []
    for name in params:
        node = graph.placeholder(name)
        node.meta[SCALAR_META] = name in scalars
        proxies.append(fx.Proxy(node, tracer))
    flat = {**dict(zip(params, proxies)), **kwargs}
    arguments = {}
    for parameter in parameter_groups(fn):
        if parameter.group is None:
            if parameter.name in flat:
                arguments[parameter.name] = flat[parameter.name]
        else:
            arguments[parameter.name] = parameter.group(*(flat[name] for name in parameter.flat_names))
    result = fn(**arguments)
    results = result if isinstance(result, tuple) else (result,)
    graph.output(tuple(r.node if isinstance(r, fx.Proxy) else r for r in results))
    for node in graph.nodes:
        if node.op == "call_function":
            node.target = _as_overload(node.target)
        elif node.op not in ("placeholder", "output"):
            raise ValueError(f"{fn.__qualname__}: {node.op} {node.target!r} is not a function call; "
                             "write torch.ops.<ns>.<op>.<overload>(...) calls only")
    return graph


def inplace_twin(op: Any) -> torch._ops.OpOverload | None:
    """``aten.add.Tensor`` -> ``aten.add_.Tensor`` (same overload of the trailing-underscore op), or None."""
    if not isinstance(op, torch._ops.OpOverload) or op._schema.name.endswith("_"):
        return None
    namespace, name = op._schema.name.split("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), name + "_")
        return getattr(packet, op._overloadname)
    except (AttributeError, RuntimeError):
        return None


def _calls(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function"]


def _is_tensor_operand(arg: Any) -> bool:
    return isinstance(arg, fx.Node) and not arg.meta.get(SCALAR_META, False)


def _commutable(node: fx.Node) -> bool:
    """Binary add/mul of two distinct tensor operands, no ``alpha``: swapping operands is the same math."""
    return (isinstance(node.target, torch._ops.OpOverload) and _op_name(node.target) in COMMUTATIVE
            and len(node.args) == 2 and not node.kwargs and node.args[0] is not node.args[1]
            and all(_is_tensor_operand(a) for a in node.args))


def apply_edits(graph: fx.Graph, edits: Iterable[tuple[str, int]]) -> fx.Graph:
    """Apply variant edits to a traced search graph; ``k`` indexes its call_function nodes in trace order."""
    calls = _calls(graph)
    for kind, k in edits:
        node = calls[k]
        if kind == "inplace":
            twin = inplace_twin(node.target)
            if twin is None:
                raise ValueError(f"{node.target} has no in-place overload")
            node.target = twin
        elif kind == "commute":
            if not _commutable(node):
                raise ValueError(f"{node.format_node()} cannot be commuted")
            node.args = (node.args[1], node.args[0])
        else:
            raise ValueError(f"unknown edit {kind!r}")
    return graph


# --------------------------------------------------------------------------------------------- pattern


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One parameter of a search or replace function: plain (``group`` None, one placeholder of its own name)
    or a group (a `typing.NamedTuple` class: one placeholder per field, `flat_names`; `literal_names` are
    those of fields not typed as tensors)."""

    name: str
    group: type | None = None
    flat_names: tuple[str, ...] = ()
    literal_names: tuple[str, ...] = ()


def _is_tensor_type(hint: Any) -> bool:
    """``Tensor`` or ``Optional[Tensor]``."""
    return hint is torch.Tensor or set(typing.get_args(hint)) == {torch.Tensor, type(None)}


def _is_group(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, tuple) and hasattr(hint, "_fields")


@functools.lru_cache(maxsize=None)
def parameter_groups(fn: Callable[..., Any]) -> tuple[Parameter, ...]:
    """The parameters of ``fn`` in order, a `typing.NamedTuple` annotation making a parameter a group. Raises
    ValueError where two parameters would bind the same placeholder name (two groups without distinct trailing
    digits, or a plain parameter named like a group's field)."""
    hints = typing.get_type_hints(fn) if inspect.isfunction(fn) or inspect.ismethod(fn) else {}
    out = []
    for name in inspect.signature(fn).parameters:
        hint = hints.get(name)
        if not _is_group(hint):
            out.append(Parameter(name))
            continue
        suffix = re.search(r"\d*$", name).group()
        fields = typing.get_type_hints(hint)
        flat = tuple(field + suffix for field in hint._fields)
        literals = tuple(field + suffix for field in hint._fields if not _is_tensor_type(fields[field]))
        out.append(Parameter(name, hint, flat, literals))
    names = [n for p in out for n in (p.flat_names if p.group else (p.name,))]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{fn.__qualname__}: parameters bind the same placeholder names {repeated}; give each "
                         "group of one type its own trailing digits (stage, stage2)")
    return tuple(out)


def _params(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The placeholder names of ``fn``: its parameters, each group's fields in its place."""
    return tuple(name for p in parameter_groups(fn) for name in (p.flat_names if p.group else (p.name,)))


def _group_literals(fn: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(name for p in parameter_groups(fn) for name in p.literal_names)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pattern:
    """One rewrite: ``search`` subgraph -> ``replace`` subgraph, usable where ``guard`` returns None."""

    name: str
    search: Callable[..., Any]
    replace: Callable[..., Any]
    exactness: str
    level: str
    guard: Guard | None = None
    scalars: tuple[str, ...] = ()
    module_types: tuple[str, ...] = ()
    doc: str = ""
    family: str = ""  # the name shared by all variants of one pattern file (defaults to ``name``)
    variant: tuple[tuple[str, Any], ...] = ()  # keyword axes passed to search and replace
    absent: tuple[str, ...] = ()  # optional tensor parameters passed as None (no placeholder)
    edits: tuple[tuple[str, int], ...] = ()  # ("inplace" | "commute", call index) on the search graph

    def __post_init__(self) -> None:
        for field in ("scalars", "module_types", "variant", "absent", "edits"):
            object.__setattr__(self, field, tuple(getattr(self, field)))
        object.__setattr__(self, "scalars", tuple(dict.fromkeys((*self.scalars, *_group_literals(self.search)))))
        if not self.family:
            object.__setattr__(self, "family", self.name)
        if self.exactness not in EXACTNESS:
            raise ValueError(f"pattern {self.name}: exactness {self.exactness!r} is not one of {EXACTNESS}")
        if check_level(self.level) == "off":
            raise ValueError(f"pattern {self.name}: level 'off' changes nothing; use 'lossless' or higher")
        if _params(self.search) != _params(self.replace):
            raise ValueError(f"pattern {self.name}: search{_params(self.search)} and "
                             f"replace{_params(self.replace)} must have the same parameters")
        if set(self.scalars) - set(self.inputs):
            raise ValueError(f"pattern {self.name}: scalars {sorted(set(self.scalars))} must name "
                             f"parameters of search {self.inputs}")
        self._check_graphs()

    @property
    def inputs(self) -> tuple[str, ...]:
        """Parameters that become placeholders (all but the keyword axes of ``variant`` and the ``absent``)."""
        fixed = {k for k, _ in self.variant} | set(self.absent)
        return tuple(p for p in _params(self.search) if p not in fixed)

    @property
    def keywords(self) -> dict[str, Any]:
        """What ``search`` and ``replace`` get besides the placeholders: the axes, and None for the absent."""
        return {**dict(self.variant), **{name: None for name in self.absent}}

    @functools.cached_property
    def search_graph(self) -> fx.Graph:
        """The traced search graph with ``edits`` applied. Shared: do not mutate."""
        graph = trace(self.search, self.inputs, self.scalars, self.keywords)
        return apply_edits(graph, self.edits)

    @functools.cached_property
    def replace_graph(self) -> fx.Graph:
        """The traced replacement graph. Shared: do not mutate."""
        return trace(self.replace, self.inputs, self.scalars, self.keywords)

    def _check_graphs(self) -> None:
        search, replace = self.search_graph, self.replace_graph
        for node in _calls(search):
            if not isinstance(node.target, torch._ops.OpOverload) and node.target is not operator.getitem:
                raise ValueError(f"pattern {self.name}: search calls {node.target!r}; "
                                 "use torch.ops.aten.<op>.<overload> so it matches exported graphs")
        for node in search.nodes:
            if node.op == "placeholder" and not node.users:
                raise ValueError(f"pattern {self.name}: search never uses parameter {node.target!r}")
        outputs = search.output_node().args[0]
        if not outputs or not all(isinstance(o, fx.Node) and o.op == "call_function" for o in outputs):
            raise ValueError(f"pattern {self.name}: search must return op results, got {outputs}")
        if len(replace.output_node().args[0]) != len(outputs):
            raise ValueError(f"pattern {self.name}: search returns {len(outputs)} values, "
                             f"replace {len(replace.output_node().args[0])}")


# --------------------------------------------------------------------------------------------- variants


def _select(sites: Sequence[fx.Node], wanted: bool | Iterable[str], ok: Callable[[fx.Node], bool]) -> list[int]:
    """Indices of call sites whose op (``add``, ``mul``...) is wanted and for which the edit applies."""
    if wanted is False:
        return []
    names = None if wanted is True else {wanted} if isinstance(wanted, str) else set(wanted)
    return [i for i, n in enumerate(sites)
            if ok(n) and (names is None or n.target._schema.name.split("::")[-1] in names)]


def _site_label(sites: Sequence[fx.Node], k: int, op_name: str) -> str:
    same = [i for i, n in enumerate(sites) if n.target == sites[k].target]
    return op_name if len(same) == 1 else f"{op_name}#{same.index(k) + 1}"


def _default_family(search: Callable[..., Any]) -> str:
    return search.__module__.rsplit(".", 1)[-1]


def _default_doc(search: Callable[..., Any]) -> str:
    module = sys.modules.get(search.__module__)
    return inspect.cleandoc((module.__doc__ if module and module.__doc__ else search.__doc__) or "")


def variants(search: Callable[..., Any], replace: Callable[..., Any], guard: Guard | None = None, *,
             exactness: str, level: str, name: str | None = None, scalars: Iterable[str] = (),
             module_types: Iterable[str] = (), doc: str | None = None,
             inplace: bool | Iterable[str] = (), commute: bool | Iterable[str] = (),
             optional: Iterable[str] = (), max_variants: int = 64, **axes: Sequence[Any]) -> tuple[Pattern, ...]:
    """All variants of one pattern, named ``name[axis=value, bias=None, add_, swap mul#2]``.

    ``axes``: keyword -> values; each combination is passed to ``search`` and ``replace`` as keywords.
    ``optional``: tensor parameters that may also be absent (an op's ``Tensor?`` argument, an add that is
    not there): each is matched present and, in a variant labelled ``param=None``, passed as None to both
    functions (which then leave it out). Variants with a parameter present come before those without it,
    earlier ``optional`` names first, so the larger subgraph is matched first.
    ``inplace``: op names (``("add", "silu")``) or True for every op with an in-place overload; each such
    site is matched out-of-place and in-place. ``commute``: op names among ``add``/``mul`` or True; each
    binary site with two tensor operands is matched in both operand orders. ``name`` defaults to the
    module name of ``search`` and ``doc`` to that module's docstring. Raises ``ValueError`` past
    ``max_variants`` (name the ops instead of ``True``).
    """
    family = name or _default_family(search)
    common = dict(search=search, replace=replace, guard=guard, exactness=exactness, level=level,
                  scalars=tuple(scalars), module_types=tuple(module_types),
                  doc=_default_doc(search) if doc is None else doc, family=family)
    axis_names, optional = list(axes), tuple(optional)
    patterns: list[Pattern] = []
    presence = itertools.product(*[(False, True)] * len(optional))  # absent? per optional name
    for values, missing in itertools.product(itertools.product(*(tuple(axes[a]) for a in axis_names)), presence):
        variant = tuple(zip(axis_names, values))
        absent = tuple(name for name, gone in zip(optional, missing) if gone)
        base = Pattern(name=family, variant=variant, absent=absent, **common)
        sites = _calls(base.search_graph)
        inplace_sites = _select(sites, inplace, lambda n: inplace_twin(n.target) is not None)
        commute_sites = _select(sites, commute, _commutable)
        choices = [(("inplace", k),) for k in inplace_sites] + [(("commute", k),) for k in commute_sites]
        for picks in itertools.product(*[((), c) for c in choices]):
            edits = tuple(e for pick in picks for e in pick)
            touched = [k for _, k in edits]
            if len(touched) != len(set(touched)):
                continue  # an in-place op with swapped operands would mutate the other tensor
            labels = [f"{a}={v}" for a, v in variant] + [f"{name}=None" for name in absent]
            for kind, k in edits:
                op = sites[k].target._schema.name.split("::")[-1]
                labels.append(_site_label(sites, k, op + "_") if kind == "inplace"
                              else "swap " + _site_label(sites, k, op))
            full = f"{family}[{', '.join(labels)}]" if labels else family
            patterns.append(dataclasses.replace(base, name=full, edits=edits))
            if len(patterns) > max_variants:
                raise ValueError(f"{family}: more than {max_variants} variants; name the ops for "
                                 "inplace=/commute= instead of True, or raise max_variants")
    if len({p.name for p in patterns}) != len(patterns):
        raise ValueError(f"{family}: variant names collide: {[p.name for p in patterns]}")
    return tuple(patterns)
