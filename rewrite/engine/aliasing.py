"""Which nodes of an exported graph may share memory with a given node, read from the op schemas.

ATen views annotate their returns with alias info (``Tensor(a)``); custom ops of the ``rewrite`` namespace
return fresh tensors. A call that is not an ``OpOverload`` (getitem, Python operators, anything else) is
assumed to alias. Used by the passes (`rewrite.passes.drop_clones`) and by the runtime's early cache
writes (`rewrite.models.wan.cache_writes`); neither needs the other for it.
"""

from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["aliases_of", "may_alias_an_input"]


def may_alias_an_input(node: fx.Node) -> bool:
    """Whether `node`'s value may share memory with one of its inputs (schema alias info; True when unknown)."""
    if node.op != "call_function":
        return True
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return any(ret.alias_info is not None for ret in target._schema.returns)
    return True  # getitem, Python operators and anything else: assume it may


def aliases_of(node: fx.Node) -> set[fx.Node]:
    """`node` and every node whose value may share its memory (views of views...)."""
    seen, stack = {node}, [node]
    while stack:
        for user in stack.pop().users:
            if user not in seen and user.op != "output" and may_alias_an_input(user):
                seen.add(user)
                stack.append(user)
    return seen
