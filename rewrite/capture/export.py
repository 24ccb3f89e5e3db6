"""Export a step function to an ATen graph and run it against a live module's parameters.

`export_step` wraps `torch.export.export(strict=False)` (pre-dispatch training IR, no decompositions:
core-ATen decomposition would turn silu into sigmoid*x and break bit-identity) with every tensor input's
batch and spatial dims marked `Dim.AUTO`, and returns a `CapturedGraph`: the lifted graph module (parameters
are placeholders, not attributes) plus the parameter names it reads. Running a captured graph fetches the
parameters from the live module by name on every call, so `load_state_dict` (even with `assign=True`) and
in-place weight updates after capture take effect on the next decode, and the state dict is never touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import time
from typing import Any, Callable, Sequence

import torch
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind


@dataclasses.dataclass
class CapturedGraph:
    """One exported step graph and what is needed to call it with a live module's weights."""

    name: str
    graph_module: torch.fx.GraphModule
    input_kinds: list[tuple[str, str | None]]  # per placeholder: ("param"|"buffer"|"constant"|"user", target)
    constants: dict[str, Any]
    range_constraints: dict[str, str]  # symbol -> value range, for the report
    dtype: torch.dtype
    device: torch.device
    capture_seconds: float
    matches: dict[str, int] = dataclasses.field(default_factory=dict)
    #: pattern family -> guard reason -> candidates it declined (e.g. a conv the Triton kernel does not serve)
    declined: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    passes: list[str] = dataclasses.field(default_factory=list)
    #: seconds per stage of getting this graph: "export" and "passes", or "disk cache load" for a graph read back
    #: from `rewrite.runtime.disk_cache`
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    #: what the runtime derives from this graph once (the steady step that writes its caches in place,
    #: `rewrite.models.wan.steps.steady_in_place`), by name: kept here so that it lives and dies with the graph (a
    #: module-level cache keyed by the graph kept every optimized Wan module alive, issue 37)
    derived: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    _binding: "_WeightBinding | None" = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def node_count(self) -> int:
        return len(self.graph_module.graph.nodes)

    @property
    def user_input_names(self) -> list[str]:
        """The names of the user (non-weight) placeholders, in call order."""
        placeholders = [n for n in self.graph_module.graph.nodes if n.op == "placeholder"]
        return [n.name for n, (kind, _) in zip(placeholders, self.input_kinds) if kind == "user"]

    def _binding_for(self, root: torch.nn.Module) -> "_WeightBinding":
        """The weight binding of `root`, resolved again when the root or the module tree along the names changed."""
        binding = self._binding
        if binding is None or binding.root is not root or not binding.tree_unchanged():
            binding = self._binding = _WeightBinding.resolve(root, self.input_kinds)
        return binding

    def weights(self, root: torch.nn.Module) -> list[torch.Tensor | None]:
        """The non-user placeholders' values, read from `root` now (by fully qualified name).

        The owning submodule of every name is resolved once per `root` and reused while the module tree
        along those names is unchanged (checked on every call, a dict lookup per edge), so a decode does
        not pay `get_parameter`'s path walk for each of hundreds of tensors.
        """
        binding = self._binding_for(root)
        values = binding.read(self.constants)
        return values if values is not None else self._weights_by_name(root)

    def weight_locations(self, root: torch.nn.Module) -> "WeightLocations | None":
        """Where the param/buffer placeholders' tensors live in `root` now (after `weights(root)` resolved them),
        for a caller that re-checks cheaply that they are still there; None when they do not resolve plainly."""
        binding = self._binding_for(root)
        if any(kind == "missing" for kind, _ in binding.slots):
            return None
        slots = [(owner._parameters if kind == "param" else owner._buffers, attr)
                 for kind, (owner, attr) in ((k, w) for k, w in binding.slots if k in ("param", "buffer"))]
        return WeightLocations([p._modules for p, _, _ in binding.edges], [n for _, n, _ in binding.edges],
                               [c for _, _, c in binding.edges], [d for d, _ in slots], [a for _, a in slots])

    def _weights_by_name(self, root: torch.nn.Module) -> list[torch.Tensor | None]:
        """`weights` the slow way: raises `get_parameter`'s AttributeError, prefixed with the name, for a name
        that no longer resolves to a parameter (buffer), e.g. one replaced by a plain tensor attribute."""
        values: list[torch.Tensor | None] = []
        for kind, target in self.input_kinds:
            try:
                if kind == "param":
                    values.append(root.get_parameter(target))
                elif kind == "buffer":
                    values.append(root.get_buffer(target))
                elif kind == "constant":
                    values.append(self.constants[target])
                else:
                    values.append(None)
            except AttributeError as error:
                raise AttributeError(f"{target}: {error}") from error
        return values

    def bind(self, weights: Sequence[torch.Tensor | None], *user_inputs: torch.Tensor) -> list[Any]:
        """The graph module's arguments, in placeholder order: `weights` from `weights(root)` with the flat
        user inputs in the user placeholders' places."""
        args: list[Any] = []
        user = iter(user_inputs)
        for value, (kind, _) in zip(weights, self.input_kinds):
            args.append(next(user) if kind == "user" else value)
        return args

    def __call__(self, weights: Sequence[torch.Tensor | None], *user_inputs: torch.Tensor) -> list[torch.Tensor]:
        """Run the graph with `weights` from `weights(root)` and the flat user inputs."""
        return list(self.graph_module(*self.bind(weights, *user_inputs)))


@dataclasses.dataclass
class WeightLocations:
    """The module-tree edges leading to a graph's weights and the dicts (``_parameters``/``_buffers``) holding
    them, as parallel lists: `tensors` and `tree_unchanged` compare them with C-level loops (``map``), a few
    tens of nanoseconds per weight, for a guard that runs on every decode."""

    edge_dicts: list[dict]  # parent._modules of each edge
    edge_names: list[str]
    edge_children: list[torch.nn.Module]
    slot_dicts: list[dict]  # owner._parameters or owner._buffers of each param/buffer placeholder
    slot_names: list[str]

    @classmethod
    def joined(cls, parts: Sequence["WeightLocations"]) -> "WeightLocations":
        """The locations of several graphs' weights as one (e.g. Wan's chunk-0 and steady graphs)."""
        return cls(*([item for part in parts for item in getattr(part, field.name)] for field in dataclasses.fields(cls)))

    def tree_unchanged(self) -> bool:
        return all(map(operator.is_, map(dict.get, self.edge_dicts, self.edge_names), self.edge_children))

    def tensors(self) -> list:
        """The param/buffer tensors there now (None where a name no longer holds one)."""
        return list(map(dict.get, self.slot_dicts, self.slot_names))


@dataclasses.dataclass
class _WeightBinding:
    """Where each placeholder's tensor lives in one module tree: (owner, "_parameters"|"_buffers", name)."""

    root: torch.nn.Module
    edges: list[tuple[torch.nn.Module, str, torch.nn.Module]]  # parent, child name, child
    slots: list[tuple[str, Any]]  # ("param"|"buffer", (owner, attr)), ("constant", target) or ("user", None)

    @classmethod
    def resolve(cls, root: torch.nn.Module, input_kinds) -> "_WeightBinding":
        edges: dict[tuple[int, str], tuple[torch.nn.Module, str, torch.nn.Module]] = {}
        slots: list[tuple[str, Any]] = []
        for kind, target in input_kinds:
            if kind not in ("param", "buffer"):
                slots.append((kind, target))
                continue
            *path, attr = target.split(".")
            owner = root
            for name in path:
                child = owner._modules.get(name)
                if child is None:  # not a plain submodule path: let the slow path raise or resolve
                    return cls(root, [], [("missing", target)])
                edges[(id(owner), name)] = (owner, name, child)
                owner = child
            slots.append((kind, (owner, attr)))
        return cls(root, list(edges.values()), slots)

    def tree_unchanged(self) -> bool:
        return all(parent._modules.get(name) is child for parent, name, child in self.edges)

    def read(self, constants: dict[str, Any]) -> list[torch.Tensor | None] | None:
        """The tensors now, or None when one is no longer where it was (a replaced or deleted attribute)."""
        values: list[torch.Tensor | None] = []
        try:
            for kind, where in self.slots:
                if kind == "param":
                    values.append(where[0]._parameters[where[1]])
                elif kind == "buffer":
                    values.append(where[0]._buffers[where[1]])
                elif kind == "constant":
                    values.append(constants[where])
                elif kind == "user":
                    values.append(None)
                else:
                    return None
        except KeyError:
            return None
        if any(v is None for v, (kind, _) in zip(values, self.slots) if kind in ("param", "buffer")):
            return None
        return values


#: attributes `optimize` installs on a module instance (`rewrite.runtime`), never part of what is traced
INSTALLED_ATTRIBUTES = ("forward", "_rewrite_runner", "_decode", "decode", "decode_tiles")


def tracing_copy(root: torch.nn.Module) -> torch.nn.Module:
    """A copy of `root`'s module tree to trace in place of the live module.

    New module objects with their own parameter, buffer and child dicts, holding the *same* tensor objects
    under the same names (so the captured graph names the live module's weights); in eval mode; without
    hooks and without the instance attributes `optimize` installs (``forward`` wrappers included: the decode
    guards refuse a live module that has them). ``torch.export`` swaps the traced module's parameters for
    fake tensors and the capture registers hooks while it traces: on the copy nobody else can see that, and
    a capture that fails leaves the live module as it was. Other attributes are shared, not copied.
    """
    def copy_module(module: torch.nn.Module) -> torch.nn.Module:
        state = {name: value for name, value in module.__dict__.items() if name not in INSTALLED_ATTRIBUTES}
        for name, value in state.items():
            if "hook" in name and isinstance(value, dict):
                state[name] = type(value)()
        state["_parameters"] = dict(module._parameters)
        state["_buffers"] = dict(module._buffers)
        state["_non_persistent_buffers_set"] = set(module._non_persistent_buffers_set)
        state["_modules"] = {name: None if child is None else copy_module(child) for name, child in module._modules.items()}
        state["training"] = False
        clone = type(module).__new__(type(module))
        clone.__dict__.update(state)  # not through Module.__setattr__: the dicts are set as they are
        return clone

    return copy_module(root)


_KINDS = {
    InputKind.PARAMETER: "param",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
    InputKind.USER_INPUT: "user",
}


def _dynamic_spec(value: Any, dims: Sequence[int]) -> Any:
    if isinstance(value, torch.Tensor):
        return {d: Dim.AUTO for d in dims if d < value.dim()}
    if isinstance(value, (list, tuple)):
        return type(value)(_dynamic_spec(v, dims) for v in value)
    return None


@contextlib.contextmanager
def _without_stack_traces():
    """Export without recording a Python stack trace per node (``torch.fx.config.do_not_emit_stack_traces``,
    where this torch has it): symbolizing them was about a tenth of the AuK export. Nothing here reads
    ``node.meta["stack_trace"]``; ``nn_module_stack``, which the patterns use, is still recorded."""
    config = getattr(torch.fx, "config", None)
    if not hasattr(config, "do_not_emit_stack_traces"):
        yield
        return
    previous = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = previous


@contextlib.contextmanager
def without_fake_tensor_cache():
    """Fake modes made meanwhile do not cache their dispatches (``torch._dynamo.config.fake_tensor_cache_enabled``,
    read when a `FakeTensorMode` is made). Their graphs and ``meta['val']``s are the same (compared node by node
    for both Wan graphs); what changes is the time: with the batch and spatial sizes symbolic almost every
    dispatch is a miss, and a miss still builds, and checks, a cache entry by synthesizing the output again
    from its metadata. Measured on this 2-core CPU, full Wan 2.1 bf16: the steady graph's export 9.1 -> 4.4 s,
    its passes 3.4 -> 2.1 s. The flag is process-wide: a fake mode another thread makes meanwhile (a
    `torch.compile` elsewhere) is only slower, never different."""
    config = torch._dynamo.config
    if not hasattr(config, "fake_tensor_cache_enabled"):
        yield
        return
    with config.patch(fake_tensor_cache_enabled=False):
        yield


def export_step(
    name: str,
    step: torch.nn.Module,
    example_inputs: tuple,
    *,
    dynamic_dims: Sequence[int],
    strip_prefix: str = "",
    post_export: Callable[[torch.fx.GraphModule], None] | None = None,
) -> CapturedGraph:
    """Export `step(*example_inputs)` with `dynamic_dims` of every tensor input left symbolic.

    `strip_prefix` is removed from parameter names so that they name the module the caller will pass to
    `CapturedGraph.weights` (e.g. the step wrapper holds the decoder as `decoder.`).
    """
    tensors = [t for t in torch.utils._pytree.tree_leaves(example_inputs) if isinstance(t, torch.Tensor)]
    start = time.perf_counter()
    with _without_stack_traces(), without_fake_tensor_cache():
        program: ExportedProgram = torch.export.export(
            step, example_inputs, dynamic_shapes=_dynamic_spec(example_inputs, dynamic_dims), strict=False
        )
    _forget_export_trace_nodes()
    seconds = time.perf_counter() - start
    input_kinds = []
    for spec in program.graph_signature.input_specs:
        kind = _KINDS.get(spec.kind)
        if kind is None:
            raise NotImplementedError(f"{name}: unsupported exported input kind {spec.kind}")
        target = spec.target
        if kind in ("param", "buffer") and target.startswith(strip_prefix):
            target = target[len(strip_prefix):]
        input_kinds.append((kind, target))
    ranges = {str(k): f"[{v.lower}, {v.upper}]" for k, v in program.range_constraints.items()}
    gm = program.graph_module
    if post_export is not None:
        post_export(gm)
    return CapturedGraph(
        name=name,
        graph_module=gm,
        input_kinds=input_kinds,
        constants=dict(program.constants),
        range_constraints=ranges,
        dtype=tensors[0].dtype,
        device=tensors[0].device,
        capture_seconds=seconds,
        timings={"export": seconds},
    )


def _forget_export_trace_nodes() -> None:
    """Empty the module-level map of the last non-strict export's trace nodes that torch keeps for its fake
    tensor leak check (`proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT`, read only inside the export that
    filled it): left as it is, it keeps the last exported graph, and so whatever module that graph ends up in,
    alive until the next export."""
    from torch.fx.experimental import proxy_tensor

    nodes = getattr(proxy_tensor, "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT", None)
    if isinstance(nodes, dict):
        nodes.clear()


def concrete_shape(val: torch.Tensor) -> list[int]:
    """The example (hint) sizes of a fake tensor whose shape may hold SymInts."""
    return [int(s.node.hint) if isinstance(s, torch.SymInt) else int(s) for s in val.shape]
