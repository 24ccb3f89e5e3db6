"""Export a step function to an ATen graph and run it against a live module's parameters.

`export_step` wraps `torch.export.export(strict=False)` (pre-dispatch training IR, no decompositions:
core-ATen decomposition would turn silu into sigmoid*x and break bit-identity) with every tensor input's
batch and spatial dims marked `Dim.AUTO`, and returns a `CapturedGraph`: the lifted graph module (parameters
are placeholders, not attributes) plus the parameter names it reads. Running a captured graph fetches the
parameters from the live module by name on every call, so `load_state_dict` (even with `assign=True`) and
in-place weight updates after capture take effect on the next decode, and the state dict is never touched.
"""

from __future__ import annotations

import dataclasses
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
    passes: list[str] = dataclasses.field(default_factory=list)

    @property
    def node_count(self) -> int:
        return len(self.graph_module.graph.nodes)

    def weights(self, root: torch.nn.Module) -> list[torch.Tensor | None]:
        """The non-user placeholders' values, read from `root` now (by fully qualified name)."""
        values: list[torch.Tensor | None] = []
        for kind, target in self.input_kinds:
            if kind == "param":
                values.append(root.get_parameter(target))
            elif kind == "buffer":
                values.append(root.get_buffer(target))
            elif kind == "constant":
                values.append(self.constants[target])
            else:
                values.append(None)
        return values

    def __call__(self, weights: Sequence[torch.Tensor | None], *user_inputs: torch.Tensor) -> list[torch.Tensor]:
        """Run the graph with `weights` from `weights(root)` and the flat user inputs."""
        args: list[Any] = []
        user = iter(user_inputs)
        for value, (kind, _) in zip(weights, self.input_kinds):
            args.append(next(user) if kind == "user" else value)
        return list(self.graph_module(*args))


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
    program: ExportedProgram = torch.export.export(
        step, example_inputs, dynamic_shapes=_dynamic_spec(example_inputs, dynamic_dims), strict=False
    )
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
    )


def concrete_shape(val: torch.Tensor) -> list[int]:
    """The example (hint) sizes of a fake tensor whose shape may hold SymInts."""
    return [int(s.node.hint) if isinstance(s, torch.SymInt) else int(s) for s in val.shape]
