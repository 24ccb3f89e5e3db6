"""Link consecutive Wan residual blocks: a block's second conv normalizes its output for the next block.

Matches: two ``rewrite::rms_norm_causal_conv3d_pair_fast`` nodes (or, for the first, the
``..._pair_fast_chain`` node an earlier match made of it) where the second block's input x is the first's
output ``y = first[0]``, the second block's shortcut is x itself (an identity shortcut, no deferred residual
bias) and nothing else reads y; the guard `wan_fast.chain_reason` accepts the first block's second conv (its
channel counts, the dtype, the second block's first activation).
Replaces: the first node by ``rewrite::rms_norm_causal_conv3d_pair_fast_chain(..., gamma3=<the second block's
first norm>, cache3=<its cache>, ...)``, whose second conv's epilogue stores y and also normalizes it into the
second block's first padded conv input and next cache (outputs 3 and 4); the second node by the chain op on
that padded input (``normalized``; its own cache argument dropped). Readers of the second block's first next
cache read output 4 of the first node instead. A run of n blocks becomes n linked nodes: each norm of a block
input runs in the epilogue of the conv before it, and no block input is read back for its norm.
Exactness: tolerance (the chain op's: the norm computed in fp32 from the rounded y and rounded once; the
``channels_last`` contract). Level: ``channels_last`` only (the pair op exists only there).
Preconditions: fuse_patterns ran (the pair op nodes exist) and every node has ``meta['val']``; the second
block's next cache has the layout the chain op returns (channels-last [B, C, 2, H, W]), else the pair is left.
Lifetimes change: the second block's padded input is allocated while the first block's second conv runs
(one more activation-sized buffer alive there; docs/tuning.md section 1.9 measured the peak).
Stats: ``matches`` {"chain_block_norms": linked pairs}, ``rejected`` {"chain_block_norms": [{node, reason}]}.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.fx.operator_schemas import normalize_function

from rewrite.engine.rewriter import PROVENANCE_META, fake_value
from rewrite.levels import level_enables
from rewrite.models.wan import ops_fast as wan_fast
from rewrite.passes.manager import PassContext, PassResult

NAME = "chain_block_norms"
PAIR = torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast.default
CHAIN = torch.ops.rewrite.rms_norm_causal_conv3d_pair_fast_chain.default
_NEXT_NORM = ("gamma", "scale", "norm_bias", "eps", "upcast", "act", "cache", "pad", "mode")  # a pair's first norm
_NO_NEXT_NORM = {"gamma3": None, "scale3": 1.0, "norm_bias3": 0.0, "eps3": 0.0, "upcast3": False, "act3": None,
                 "cache3": None, "pad3": [0, 0, 0, 0, 0, 0], "mode3": "steady"}


def _bound(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name (defaults filled in)."""
    return normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True).kwargs


def _as_chain(node: fx.Node) -> dict[str, Any]:
    """A pair or chain node's arguments as the chain op's."""
    values = _bound(node)
    if node.target is PAIR:
        values = {"normalized": None, **values, **_NO_NEXT_NORM}
    return values


def _items(node: fx.Node) -> dict[int, fx.Node]:
    return {u.args[1]: u for u in node.users if u.target is operator.getitem}


def _val(value: Any) -> Any:
    return value.meta["val"] if isinstance(value, fx.Node) else value


def _call(graph: fx.Graph, values: dict[str, Any], like: fx.Node) -> fx.Node:
    """A chain op node of `values` (inserted at the graph's insert point) with its fake value and `like`'s
    provenance."""
    names = [a.name for a in CHAIN._schema.arguments]
    node = graph.call_function(CHAIN, tuple(values[n] for n in names))
    fake_mode = detect_fake_mode([_val(v) for v in values.values() if isinstance(v, fx.Node)])
    node.meta["val"] = fake_value(node, fake_mode, NAME)
    for key in PROVENANCE_META:
        if key in like.meta:
            node.meta[key] = like.meta[key]
    node.meta["rewrite_pattern"] = NAME
    return node


def _item(graph: fx.Graph, node: fx.Node, index: int) -> fx.Node:
    item = graph.call_function(operator.getitem, (node, index))
    item.meta["val"] = node.meta["val"][index]
    return item


def _reason(first: dict[str, Any], second: dict[str, Any], y: fx.Node, reader: fx.Node) -> str | None:
    """Why the blocks of arguments `first` (as the chain op's) and `second` (the pair op `reader`'s, whose
    input y is) are not linked, or None."""
    if second["residual"] is not y or second["residual_bias"] is not None:
        return "the second block's shortcut is not its input (a conv shortcut)"
    if set(y.users) != {reader}:
        return "the first block's output has other readers"
    if first["gamma3"] is not None:
        return "the first block already normalizes for another reader"
    weight2 = _val(first["weight2"])
    return wan_fast.chain_reason(weight2.shape[1], weight2.shape[0], _val(y).dtype, second["act"])


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, sizes and strides, provably for symbolic ones (no guard is added to the graph's shapes)."""
    pairs = list(zip(a.shape, b.shape)) + list(zip(a.stride(), b.stride()))
    return (a.dtype == b.dtype and a.dim() == b.dim()
            and all(statically_known_true(x == y) for x, y in pairs))


def chain_block_norms(gm: fx.GraphModule, ctx: PassContext) -> PassResult:
    """Link each served pair of consecutive residual blocks; see the module docstring."""
    stats: dict = {"matches": {NAME: 0}, "rejected": {NAME: []}}
    if not level_enables(ctx.level, "channels_last"):
        return PassResult(gm, False, stats)
    graph = gm.graph
    for second in list(graph.nodes):
        if second.op != "call_function" or second.target is not PAIR:
            continue
        y = _bound(second)["x"]
        if not (isinstance(y, fx.Node) and y.target is operator.getitem and y.args[1] == 0):
            continue
        first = y.args[0]
        if first.target not in (PAIR, CHAIN):
            stats["rejected"][NAME].append({"node": second.name, "reason": "the block input is not a block output"})
            continue
        first_args, second_args = _as_chain(first), _bound(second)
        reason = _reason(first_args, second_args, y, second)
        if reason is None:
            with graph.inserting_after(first):
                linked = _call(graph, {**first_args, **{f"{k}3": second_args[k] for k in _NEXT_NORM}}, first)
            with graph.inserting_after(linked):
                next_input = _item(graph, linked, 3)
                next_cache = _item(graph, linked, 4)
            old_cache = _items(second).get(1)
            if old_cache is not None and not _same_layout(old_cache.meta["val"], next_cache.meta["val"]):
                reason = "the second block's next cache is not laid out as the chain op returns it"
                for node in (next_cache, next_input, linked):
                    graph.erase_node(node)
        if reason is not None:
            stats["rejected"][NAME].append({"node": second.name, "reason": reason})
            continue
        for index, item in _items(first).items():
            item.args = (linked, index)
        graph.erase_node(first)
        values = {"normalized": next_input, **second_args, **_NO_NEXT_NORM, "cache": None}
        with graph.inserting_before(second):
            consumer = _call(graph, values, second)
        for index, item in _items(second).items():
            if index == 1:
                item.replace_all_uses_with(next_cache)
                graph.erase_node(item)
            else:
                item.args = (consumer, index)
        graph.erase_node(second)
        stats["matches"][NAME] += 1
    if stats["matches"][NAME]:
        graph.lint()
        gm.recompile()
    return PassResult(gm, bool(stats["matches"][NAME]), stats)
