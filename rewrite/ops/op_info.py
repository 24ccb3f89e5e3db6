"""What a caller may know about a custom op beyond its schema, declared beside the op's definition.

`reads_channels_last_weight(*arguments)`: the op's kernel path hands its conv each of `arguments` (a conv weight) in
channels-last memory, converting a contiguous one on every call (inside a CUDA graph: on every replay), while
its reference path makes the weight contiguous again. A caller may therefore pass a channels-last copy of
the weight in its place, the same values, and nothing is converted per call: the Wan runtime keeps such
copies (`rewrite.models.wan.conv_weights`) for every graph input that only such arguments read. Which ops
qualify is a property of the op, so it is declared with the op (a `torch.library` tag cannot be defined
outside PyTorch):

    @reads_channels_last_weight("weight")
    @torch.library.custom_op("rewrite::causal_conv3d", mutates_args=())
    def causal_conv3d(...): ...
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["channels_last_weight_arguments", "channels_last_weight_ops", "reads_channels_last_weight"]

_CHANNELS_LAST_WEIGHT: dict[str, tuple[str, ...]] = {}  # qualified op name -> its weight arguments' names


def reads_channels_last_weight(*arguments: str) -> Callable[[Any], Any]:
    """Declare of a `torch.library.custom_op` that it reads each of `arguments` (default ``"weight"``) as a
    channels-last conv weight (module docstring); returns the op unchanged."""
    arguments = arguments or ("weight",)

    def declare(op: Any) -> Any:
        names = [a.name for a in op._opoverload._schema.arguments]
        for argument in arguments:
            if argument not in names:
                raise ValueError(f"{op._qualname} has no argument {argument!r} (its arguments: {names})")
        _CHANNELS_LAST_WEIGHT[op._qualname] = tuple(arguments)
        return op

    return declare


def channels_last_weight_ops() -> dict[str, tuple[str, ...]]:
    """Every op declared so far (qualified name -> its weight arguments' names); an op declares itself when
    its module is imported."""
    return dict(_CHANNELS_LAST_WEIGHT)


def channels_last_weight_arguments(target: Any) -> list[tuple[int, str]]:
    """(position, name) of each channels-last weight argument of an FX node's target (none: empty)."""
    if not isinstance(target, torch._ops.OpOverload):
        return []
    names = _CHANNELS_LAST_WEIGHT.get(target._schema.name, ())
    schema_names = [a.name for a in target._schema.arguments]
    return [(schema_names.index(name), name) for name in names]
