"""Remove exact no-ops that export leaves in a captured graph.

Matches (each node is replaced by its input, never by anything computed):
  * `aten._assert_tensor_metadata` (checks only, no value);
  * `aten.to.*` / `aten._to_copy` is NOT touched: only `aten.to.dtype`, `aten.to.dtype_layout`,
    `aten.to.device` whose input already has the requested dtype, device and layout and that do not ask
    for a copy (ATen returns the input itself: an alias);
  * `aten.type_as` whose input already has the other tensor's dtype (also an alias);
  * `aten.dropout` with `p == 0` or `train == False` (returns its input);
  * `aten.slice.Tensor` over a whole dim (start 0, end >= its size, step 1): a view with the input's own
    sizes and strides, which is what `x[:, :, -2:]` leaves on every untouched dim;
  * `aten.alias` not returned by the graph (a view with the input's own sizes and strides: what an export
    with static sizes leaves of such a whole-dim slice, where the symbolic export keeps the slice).
Exactness: exact (every removed node returns its input unchanged; aliases stay aliases).
Preconditions: a graph from `torch.export` with `meta['val']` on every node. Ensures: the graph lints, no
new nodes; the baked device names of removed `to` nodes are gone, everything else is as captured.
Must run first: patterns are written against the canonical form.
"""

from __future__ import annotations

import torch

from rewrite.passes.manager import PassContext, PassResult

aten = torch.ops.aten


def _val(node: torch.fx.Node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_same_tensor_conversion(node: torch.fx.Node) -> bool:
    """A `to` that ATen answers with its input: same dtype/device/layout, no copy, no memory-format change."""
    src, out = _val(node.args[0]), _val(node)
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    if node.kwargs.get("copy", False) or node.kwargs.get("memory_format") not in (None, torch.preserve_format):
        return False
    positional_flags = [a for a in node.args[1:] if isinstance(a, bool)]
    if any(positional_flags[1:2]):  # to.dtype(self, dtype, non_blocking, copy): copy=True
        return False
    return src.dtype == out.dtype and src.device == out.device and src.layout == out.layout


def _is_full_slice(node: torch.fx.Node) -> bool:
    src, out = _val(node.args[0]), _val(node)
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    dim, start, end, step = (list(node.args[1:]) + [0, None, None, 1][len(node.args) - 1:])[:4]
    if start not in (0, None) or step != 1 or isinstance(end, torch.fx.Node):
        return False
    size = src.shape[dim]
    return end is None or end >= 2**63 - 1 or (isinstance(size, int) and end >= size)


def _removable_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The node this no-op can be replaced by, or None when it is not an exact no-op."""
    if node.op != "call_function":
        return None
    target = node.target
    if target in (aten.to.dtype, aten.to.dtype_layout, aten.to.device):
        return node.args[0] if _is_same_tensor_conversion(node) else None
    if target is aten.type_as.default:
        src, other = _val(node.args[0]), _val(node.args[1])
        if isinstance(src, torch.Tensor) and isinstance(other, torch.Tensor) and src.dtype == other.dtype:
            return node.args[0]
        return None
    if target is aten.slice.Tensor:
        return node.args[0] if _is_full_slice(node) else None
    if target is aten.alias.default:
        return None if any(user.op == "output" for user in node.users) else node.args[0]
    if target is aten.dropout.default:
        p, train = node.args[1], node.args[2]
        return node.args[0] if (p == 0 or not train) else None
    return None


def canonicalize(gm: torch.fx.GraphModule, ctx: PassContext | None = None) -> PassResult:
    """Drop metadata asserts and identity conversions; see the module docstring for the exact list."""
    removed: dict[str, int] = {}
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten._assert_tensor_metadata.default:
            gm.graph.erase_node(node)
            removed["_assert_tensor_metadata"] = removed.get("_assert_tensor_metadata", 0) + 1
            continue
        replacement = _removable_input(node)
        if replacement is not None:
            node.replace_all_uses_with(replacement)
            gm.graph.erase_node(node)
            key = str(node.target).replace("aten.", "")
            removed[key] = removed.get(key, 0) + 1
    changed = bool(removed)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return PassResult(gm, changed, {"removed": removed})
