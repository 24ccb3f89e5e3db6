"""Steady-step graphs that write each new cache into its input buffer as soon as the old cache is dead.

A Wan steady step takes ``(x, *caches)`` and returns ``(y, *new_caches)``; its CUDA graph then copies every
new cache into the static cache buffers at the end (`rewrite.models.wan.runner`). So all the new caches are
alive at once at the end of the step, on top of the old ones: that is what set the peak memory of a `lossless`
decode above diffusers' own (docs/tuning.md section 1.16). `write_caches_in_place` returns a copy of the graph in which each new cache
is copied into its cache input (``aten.copy_``) right after the last node that reads the old cache or a view
of it, so it dies there; the graph then returns ``(y, *new caches it could not write early)``. Where the new
cache comes from an op that can write it into the old cache's buffer itself (`rewrite.ops.cache_into`: the
op is that cache's last reader and declares it with `writes_next_caches`), the op is called through
`cache_into.write_next_caches_into` with the buffer instead, and there is no copy at all.

Matches: the step graph's user placeholders ``x, cache_0 .. cache_n`` and its flat output ``(y, new_0 ..
new_n)`` (same count). Exactness: exact (the same values land in the same buffers; only the time of the
copy moves). Preconditions, checked: a cache whose new value may alias an old cache (a view of it, through
any op whose schema declares an aliasing return) is left for the end-of-step copy, as is the cache it
aliases, and nothing is moved when ``y`` may alias a cache. Which nodes may alias an input is read from
the op schemas (`rewrite.engine.aliasing`: ATen views annotate their returns; custom ops return fresh
tensors; any other call is assumed to alias).
"""

from __future__ import annotations

import copy
import operator
from typing import Optional

import torch
import torch.fx as fx
from torch.fx.operator_schemas import normalize_function

from rewrite.engine.aliasing import aliases_of
from rewrite.ops import cache_into

__all__ = ["static_cache_formats", "write_caches_in_place"]


def write_caches_in_place(graph_module: fx.GraphModule, user_inputs: list[str]) -> tuple[fx.GraphModule, list[int]]:
    """A copy of `graph_module` writing its new caches into its cache inputs early (module docstring).

    `user_inputs`: the names of the user placeholders, ``x`` first and then the caches in output order.
    Returns the new module and the indices of the caches it still returns (after ``y``, in that order): the
    caller copies those into their buffers after the step, as before.
    """
    graph = copy.deepcopy(graph_module.graph)
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    output = next(n for n in graph.nodes if n.op == "output")
    outputs = list(output.args[0])
    caches = [placeholders[name] for name in user_inputs[1:]]
    if len(outputs) != len(caches) + 1:
        raise ValueError(f"write_caches_in_place: {len(caches)} cache inputs but {len(outputs) - 1} cache outputs")
    y, new = outputs[0], outputs[1:]
    alias_sets = [aliases_of(cache) for cache in caches]
    if any(y in aliases for aliases in alias_sets):
        return graph_module, list(range(len(caches)))
    kept = set()
    for i, value in enumerate(new):
        for j, aliases in enumerate(alias_sets):
            if value in aliases:
                kept.update((i, j))
    # Positions before any insertion serve every cache: a copy inserted for cache i reads only cache i and
    # its fresh new value, so it never is a reader of another written cache (that one would be in `kept`).
    order = {n: k for k, n in enumerate(graph.nodes)}
    into: dict[fx.Node, list[tuple[int, fx.Node]]] = {}  # op node -> (output index, cache buffer) it writes into
    writers = cache_into.next_cache_writers()
    for i, (cache, value) in enumerate(zip(caches, new)):
        if i in kept:
            continue
        readers = [user for alias in alias_sets[i] for user in alias.users if user.op != "output"]
        writer = _writer_into(value, cache, readers, order, writers)
        if writer is not None:
            into.setdefault(writer[0], []).append((writer[1], cache))
            continue
        last = max([value, cache, *readers], key=order.__getitem__)
        with graph.inserting_after(last):
            graph.call_function(torch.ops.aten.copy_.default, (cache, value))
    for node, pairs in into.items():
        with graph.inserting_before(node):
            indices, buffers = zip(*pairs)
            call = graph.call_function(cache_into.write_next_caches_into, (node.target, indices, buffers, *node.args),
                                       dict(node.kwargs))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
    remaining = sorted(kept)
    output.args = (tuple([y, *(new[i] for i in remaining)]),)
    graph.lint()
    return fx.GraphModule(graph_module, graph), remaining


def _writer_into(value: fx.Node, cache: fx.Node, readers: list[fx.Node], order: dict[fx.Node, int],
                 writers: dict[str, dict[int, str]]) -> Optional[tuple[fx.Node, int]]:
    """(op node, output index) where `value` is that output of an op declared by `cache_into.writes_next_caches`
    (`writers`) whose argument for it is `cache` and which is the last reader of `cache` (and of its views);
    else None."""
    if value.op != "call_function" or value.target is not operator.getitem:
        return None
    node, index = value.args
    if not (isinstance(node, fx.Node) and node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)):
        return None
    outputs = writers.get(node.target._schema.name, {})
    if index not in outputs or any(order[reader] > order[node] for reader in readers):
        return None
    bound = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    if bound is None or bound.kwargs.get(outputs[index]) is not cache:
        return None
    return node, index


def static_cache_formats(graph_module: fx.GraphModule, user_inputs: list[str]) -> list[Optional[torch.memory_format]]:
    """Per cache input of a steady step graph (``user_inputs`` as for `write_caches_in_place`), the memory
    format its static buffer should have so that the step's copy of the new cache into it is a plain memcpy:
    ``torch.channels_last_3d`` where the graph returns that new cache channels-last (its output's fake value,
    e.g. `rewrite::causal_conv3d`'s next cache) and every reader of the cache input is a ``rewrite`` custom op or
    reads its sizes alone (`_reads_no_strides`: their values do not depend on an input's strides); else None
    (`rewrite.runtime.graph_memory.CacheArena.buffers`: contiguous in the shared block, chunk 0's layout outside).

    Why: chunk 0 may return such a cache in another layout (Wan's `time_conv` caches come out of it
    contiguous), and a static buffer in that layout makes every steady step copy the new cache across
    layouts, an uncoalesced strided copy ten times as slow as a memcpy (docs/tuning.md section 1.16)."""
    placeholders = {n.name: n for n in graph_module.graph.nodes if n.op == "placeholder"}
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    new = list(output.args[0])[1:]
    formats: list[Optional[torch.memory_format]] = []
    for name, value in zip(user_inputs[1:], new):
        val = value.meta.get("val") if isinstance(value, fx.Node) else None
        readers = list(placeholders[name].users)
        channels_last = (isinstance(val, torch.Tensor) and val.dim() == 5 and not val.is_contiguous()
                         and val.is_contiguous(memory_format=torch.channels_last_3d))
        formats.append(torch.channels_last_3d if channels_last and all(map(_reads_no_strides, readers)) else None)
    return formats


# ATen ops reading a tensor's sizes alone: a symbolic graph reads a cache input's batch, height and width with them
# (the encoder's shape arithmetic), and a buffer's layout does not change what they return.
_SIZE_READERS = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_size.default,
                           torch.ops.aten.sym_numel.default})


def _reads_no_strides(reader: fx.Node) -> bool:
    """Whether `reader`'s values do not depend on its input's strides: the graph's output, a ``rewrite`` custom op
    (each assembles its own operands) or an op reading sizes alone (`_SIZE_READERS`)."""
    if reader.op == "output":
        return True
    return reader.op == "call_function" and (reader.target in _SIZE_READERS or (
        isinstance(reader.target, torch._ops.OpOverload) and reader.target.namespace == "rewrite"))
