"""A rewritten `CapturedGraph` as plain JSON data, and back: what the disk cache stores (no tensors, no pickle).

`encode(graph)` writes the graph's nodes in order (op, name, target, args, kwargs), its input kinds (names of
the parameters and buffers it reads, never their values), its symbolic ranges, the matches and passes of its
rewrite; `decode(data)` builds the same `torch.fx` graph again, node for node, with the same names (the
runtime reads user inputs by placeholder name), so the rebuilt module's code is the original's (`encode`
checks that itself and refuses a graph it cannot reproduce).

What the data may hold: node references, None, bools, ints, floats (inf and nan included), strings, lists,
tuples, string-keyed dicts, dtypes, devices, memory formats, layouts; targets are `OpOverload`s (by
qualified name, resolved through ``torch.ops``: the `rewrite` ops must be registered before `decode`) and
functions of `operator`, `math` and `torch`'s symbolic helpers. Anything else raises `GraphFileError`
(the caller then does not cache that graph). Not kept: node ``meta`` (fake values, module stacks), which
nothing reads after the passes ran; lifted constant tensors (a graph with ``constant`` inputs is refused:
the project's graphs have none, their non-persistent buffers are read from the module by name).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx as fx

from rewrite.capture.export import CapturedGraph

#: version of the data layout below; another value is refused by `decode`
FORMAT = 1
#: modules whose functions a graph may call besides ``torch.ops`` (resolved by name on load)
_FUNCTION_MODULES = {"_operator": operator, "operator": operator, "math": math, "torch": torch}
_MEMORY_FORMATS = {str(f): f for f in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d,
                                       torch.preserve_format)}
_LAYOUTS = {str(f): f for f in (torch.strided, torch.sparse_coo)}


class GraphFileError(ValueError):
    """A graph that cannot be written as data, or data that is not a graph this code wrote."""


def encode(graph: CapturedGraph) -> dict:
    """`graph` (after its passes) as JSON-compatible data; `GraphFileError` when some part cannot be."""
    if any(kind == "constant" for kind, _ in graph.input_kinds):
        raise GraphFileError(f"{graph.name}: lifted constant tensors are not written to the disk cache")
    nodes = []
    for node in graph.graph_module.graph.nodes:
        if node.op not in ("placeholder", "call_function", "output"):
            raise GraphFileError(f"{graph.name}: node {node.name} is a {node.op} (only placeholders, calls and "
                                 "the output are written)")
        target = _target_name(node) if node.op == "call_function" else None
        nodes.append([node.op, node.name, target, _value(node.args), _value(node.kwargs)])
    data = {
        "format": FORMAT, "name": graph.name, "dtype": str(graph.dtype), "device": str(graph.device),
        "input_kinds": [list(kind) for kind in graph.input_kinds], "range_constraints": dict(graph.range_constraints),
        "matches": dict(graph.matches), "declined": graph.declined, "passes": list(graph.passes), "nodes": nodes,
    }
    rebuilt = decode(data)
    if rebuilt.graph_module.code != graph.graph_module.code:
        raise GraphFileError(f"{graph.name}: the graph rebuilt from its data differs from the original")
    return data


def decode(data: dict) -> CapturedGraph:
    """The `CapturedGraph` that `encode` wrote (no ``timings``: the caller records what loading cost). Raises
    `GraphFileError` for data it cannot rebuild."""
    try:
        if data.get("format") != FORMAT:
            raise GraphFileError(f"graph data format {data.get('format')!r}, expected {FORMAT}")
        graph = fx.Graph()
        env: dict[str, fx.Node] = {}
        for op, name, target, args, kwargs in data["nodes"]:
            args, kwargs = _restore(args, env), _restore(kwargs, env)
            if op == "placeholder":
                node = graph.placeholder(name)
            elif op == "call_function":
                node = graph.create_node(op, _resolve(target), tuple(args), kwargs, name=name)
            elif op == "output":
                node = graph.output(args[0])
            else:
                raise GraphFileError(f"node {name}: op {op!r}")
            if node.name != name:
                raise GraphFileError(f"node {name} was named {node.name} on load")
            env[name] = node
        graph.lint()
        module = fx.GraphModule(torch.nn.Module(), graph)
        kinds = [(kind, target) for kind, target in data["input_kinds"]]
        placeholders = sum(1 for n in graph.nodes if n.op == "placeholder")
        if len(kinds) != placeholders:
            raise GraphFileError(f"{len(kinds)} input kinds for {placeholders} placeholders")
        return CapturedGraph(
            name=data["name"], graph_module=module, input_kinds=kinds, constants={},
            range_constraints=dict(data["range_constraints"]), dtype=_DTYPES[data["dtype"]],
            device=torch.device(data["device"]), capture_seconds=0.0, matches=dict(data["matches"]),
            declined={family: dict(reasons) for family, reasons in data.get("declined", {}).items()},
            passes=list(data["passes"]),
        )
    except GraphFileError:
        raise
    except Exception as error:  # malformed data of any shape: one error type for the caller
        raise GraphFileError(f"malformed graph data: {type(error).__name__}: {error}") from error


_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64)}


def _target_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"op:{target.name()}"  # "aten::add.Tensor", "rewrite::rms_norm" (default overload: no suffix)
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if module in _FUNCTION_MODULES and name and getattr(_FUNCTION_MODULES[module], name, None) is target:
        return f"fn:{module}.{name}"
    raise GraphFileError(f"node {node.name}: target {target!r} cannot be written")


def _resolve(name: str) -> Any:
    kind, _, qualified = name.partition(":")
    if kind == "op":
        namespace, _, rest = qualified.partition("::")
        op_name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, namespace), op_name)
        return getattr(packet, overload or "default")
    if kind == "fn":
        module, _, attr = qualified.rpartition(".")
        if module in _FUNCTION_MODULES:
            return getattr(_FUNCTION_MODULES[module], attr)
    raise GraphFileError(f"unknown target {name!r}")


def _value(value: Any) -> Any:
    """An argument as JSON data: lists stay lists, everything else a tagged one-key dict or a scalar."""
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, tuple):
        return {"tuple": [_value(v) for v in value]}
    if isinstance(value, list):
        return [_value(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"dict": {k: _value(v) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value)}
    raise GraphFileError(f"argument {value!r} of type {type(value).__name__} cannot be written")


def _restore(value: Any, env: dict[str, fx.Node]) -> Any:
    if isinstance(value, list):
        return [_restore(v, env) for v in value]
    if not isinstance(value, dict):
        return value
    (tag, inner), = value.items()
    if tag == "node":
        return env[inner]
    if tag == "tuple":
        return tuple(_restore(v, env) for v in inner)
    if tag == "dict":
        return {k: _restore(v, env) for k, v in inner.items()}
    if tag == "float":
        return float(inner)
    if tag == "dtype":
        return _DTYPES[inner]
    if tag == "device":
        return torch.device(inner)
    if tag == "memory_format":
        return _MEMORY_FORMATS[inner]
    if tag == "layout":
        return _LAYOUTS[inner]
    raise GraphFileError(f"unknown argument tag {tag!r}")
