"""Drop copies of a functional graph's tensors: the copy's users read its input instead.

Matches: `aten.clone.default(x)` with no memory format or `preserve_format`, and `aten.pad.default(x, pad, ...)`
with every pad entry 0 (ATen's `constant_pad_nd` then returns a preserve-format clone), whose output has the
strides of `x` (ATen's preserve-format clone of a dense tensor keeps them). In an exported graph nothing mutates a
tensor, so the copy is never needed for its value: Wan 2.2's up blocks keep `x.clone()` of the block input
for the DupUp3D shortcut at the block's end, and its encoder's `AvgDown3D` shortcuts pad the block input by
`pad_t` = 0 frames in every steady step; each a full read and write of the block input per step.
Exactness: exact (the users read the same values in the same layout).
Preconditions, checked: no node of the graph is a mutating op (schema `is_mutable`; a call that is not an
`OpOverload` counts as mutating unless it is a function of Python's `operator` module: getitem, symbolic
size arithmetic), and neither the clone nor any node that may
alias it (views, by schema alias info) is a graph output (an output must not alias an input or another
output). Lifetimes change: `x` lives until the clone's last user instead of the clone.
Requires: fuse_patterns ran (patterns such as the causal-conv cache assembly match graphs with their clones).
Ensures: the graph lints; no new nodes.
"""

from __future__ import annotations


import torch
import torch.fx as fx

from rewrite.engine.aliasing import aliases_of
from rewrite.passes.manager import PassContext, PassResult

aten = torch.ops.aten


def _mutating_node(graph: fx.Graph) -> fx.Node | None:
    for node in graph.nodes:
        if node.op != "call_function" or getattr(node.target, "__module__", None) in ("operator", "_operator"):
            continue
        if not isinstance(node.target, torch._ops.OpOverload) or node.target._schema.is_mutable:
            return node
    return None


def _strides(node) -> tuple | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return tuple(value.stride()) if isinstance(value, torch.Tensor) else None


def _copies_its_input(node: fx.Node) -> bool:
    """A preserve-format clone, or a pad by 0 on every side (a clone of its input, whatever the mode)."""
    if node.op != "call_function":
        return False
    if node.target is aten.clone.default:
        return node.kwargs.get("memory_format") in (None, torch.preserve_format)
    if node.target is aten.pad.default:
        return all(type(entry) is int and entry == 0 for entry in node.args[1])
    return False


def _droppable(node: fx.Node) -> bool:
    if not _copies_its_input(node):
        return False
    strides = _strides(node)
    if strides is None or strides != _strides(node.args[0]):
        return False
    return not any(user.op == "output" for alias in aliases_of(node) for user in alias.users)


def drop_redundant_clones(gm: fx.GraphModule, ctx: PassContext | None = None) -> PassResult:
    """Replace each droppable copy (clone or zero pad) by its input; see the module docstring."""
    mutating = _mutating_node(gm.graph)
    if mutating is not None:
        return PassResult(gm, False, {"dropped": 0, "skipped": f"{mutating.name} ({mutating.target}) may mutate"})
    dropped = 0
    for node in list(gm.graph.nodes):
        if _droppable(node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
            dropped += 1
    if dropped:
        gm.graph.lint()
        gm.recompile()
    return PassResult(gm, bool(dropped), {"dropped": dropped})
