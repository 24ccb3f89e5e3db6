"""What a caller may know about a custom op beyond its schema, declared beside the op's definition.

`reads_channels_last_weight(argument)`: the op's kernel path hands cuDNN its `argument` (a conv weight) in
channels-last memory, converting a contiguous one on every call (inside a CUDA graph: on every replay), while
its reference path makes the weight contiguous again. A caller may therefore pass a channels-last copy of
the weight in its place, the same values, and nothing is converted per call: the Wan runtime keeps such
copies (`rewrite.runtime.conv_weights`) for every graph input that only such arguments read. Which ops
qualify is a property of the op, so it is declared with the op (a `torch.library` tag cannot be defined
outside PyTorch):

    @reads_channels_last_weight("weight")
    @torch.library.custom_op("rewrite::causal_conv3d", mutates_args=())
    def causal_conv3d(...): ...
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

__all__ = ["channels_last_weight_argument", "channels_last_weight_ops", "reads_channels_last_weight"]

_CHANNELS_LAST_WEIGHT: dict[str, str] = {}  # qualified op name ("rewrite::causal_conv3d") -> argument name


def reads_channels_last_weight(argument: str = "weight") -> Callable[[Any], Any]:
    """Declare of a `torch.library.custom_op` that it reads `argument` as a channels-last conv weight (module
    docstring); returns the op unchanged."""

    def declare(op: Any) -> Any:
        names = [a.name for a in op._opoverload._schema.arguments]
        if argument not in names:
            raise ValueError(f"{op._qualname} has no argument {argument!r} (its arguments: {names})")
        _CHANNELS_LAST_WEIGHT[op._qualname] = argument
        return op

    return declare


def channels_last_weight_ops() -> dict[str, str]:
    """Every op declared so far (qualified name -> argument name); an op declares itself when its module is
    imported."""
    return dict(_CHANNELS_LAST_WEIGHT)


def channels_last_weight_argument(target: Any) -> Optional[tuple[int, str]]:
    """(position, name) of the channels-last weight argument of an FX node's target, None if it has none."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = _CHANNELS_LAST_WEIGHT.get(target._schema.name)
    if name is None:
        return None
    return [a.name for a in target._schema.arguments].index(name), name
