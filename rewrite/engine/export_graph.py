"""Export an fx graph for viewing: as a networkx DiGraph, as DOT text, and as GraphML.

``graph_to_networkx`` turns every fx node into a networkx node named like the fx node, with string
attributes that GraphML can hold (``op``, ``target``, ``shape``, ``dtype``, ``module``), and one edge per
data dependency (producer -> consumer). ``to_dot`` writes DOT text by hand (no graphviz or pydot needed):
nodes named in ``fill`` are drawn filled in the given color. Attributes are never ``None``, so
``networkx.write_graphml`` accepts the result as is.

Exactness: read-only; nothing here changes the fx graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import networkx as nx
import torch
import torch.fx as fx

from rewrite.engine.matcher import describe_target, module_path


def _format_dim(dim: object) -> str:
    return str(dim)  # SymInts print as their symbol (s0) or expression (2*s1)


def describe_value(val: object) -> tuple[str, str]:
    """``(shape, dtype)`` of a node's ``meta['val']`` as text: ``("[s0, 16, 1, s1, s2]", "float32")``.

    A tuple/list of tensors gives each shape and dtype, comma-separated; anything else gives ``("", "")``.
    """
    if isinstance(val, torch.Tensor):
        return "[" + ", ".join(_format_dim(d) for d in val.shape) + "]", str(val.dtype).removeprefix("torch.")
    if isinstance(val, (list, tuple)) and val and all(isinstance(v, torch.Tensor) for v in val):
        parts = [describe_value(v) for v in val]
        return ", ".join(shape for shape, _ in parts), ", ".join(dtype for _, dtype in parts)
    return "", ""


def node_attributes(node: fx.Node) -> dict[str, str]:
    """The attributes ``graph_to_networkx`` gives one fx node (all strings)."""
    shape, dtype = describe_value(node.meta.get("val"))
    return {"op": node.op, "target": describe_target(node), "shape": shape, "dtype": dtype,
            "module": module_path(node)}


def graph_to_networkx(graph: fx.Graph) -> nx.DiGraph:
    """Every node of ``graph`` (by name, in graph order) with ``node_attributes``; edges producer -> user."""
    digraph = nx.DiGraph()
    for node in graph.nodes:
        digraph.add_node(node.name, **node_attributes(node))
        for producer in node.all_input_nodes:
            digraph.add_edge(producer.name, node.name)
    return digraph


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _label(name: str, attributes: Mapping[str, str]) -> str:
    lines = [name]
    if attributes.get("op") == "call_function":
        lines.append(attributes.get("target", ""))
    shape_dtype = " ".join(v for v in (attributes.get("shape", ""), attributes.get("dtype", "")) if v)
    if shape_dtype:
        lines.append(shape_dtype)
    return "\n".join(lines)


def to_dot(digraph: nx.DiGraph, name: str, fill: Mapping[str, str] | None = None,
           legend: Iterable[tuple[str, str]] = (), dashed: Iterable[str] = ()) -> str:
    """DOT text of ``digraph`` (nodes labelled name / target / shape dtype).

    ``fill``: node -> fill color for highlighted nodes; ``legend``: ``(text, color)`` rows drawn as a
    separate box; ``dashed``: nodes drawn with a dashed outline (e.g. the inputs of a subgraph).
    """
    fill = fill or {}
    dashed = set(dashed)
    lines = [f"digraph {_quote(name)} {{", "  rankdir=TB;", '  node [shape=box, fontname="monospace", fontsize=10];']
    for node, attributes in digraph.nodes(data=True):
        style = []
        options = [f"label={_quote(_label(node, attributes))}"]
        if node in fill:
            style.append("filled")
            options.append(f"fillcolor={_quote(fill[node])}")
        if node in dashed:
            style.append("dashed")
        if style:
            options.append(f"style={_quote(','.join(style))}")
        lines.append(f"  {_quote(node)} [{', '.join(options)}];")
    for producer, user in digraph.edges():
        lines.append(f"  {_quote(producer)} -> {_quote(user)};")
    legend = list(legend)
    if legend:
        lines.append('  subgraph "cluster_legend" {')
        lines.append('    label="legend"; fontname="monospace";')
        for i, (text, color) in enumerate(legend):
            lines.append(f'    "legend_{i}" [label={_quote(text)}, style="filled", fillcolor={_quote(color)}];')
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
