"""Whether something could cast a module's input before its forward runs: the shared test behind the clear
dtype errors of the decoders' entry points (`rewrite.runtime.guards.refused_input_dtype`, `AuKVAE.decode`).

A conv raises for an input of another dtype than its weight's. An entry point may say so in a clearer error
only where nothing could change the input's dtype on the way: `torch.autocast` on the input's device, a
`__torch_function__` tensor subclass or mode, global module hooks, or forward (pre-)hooks or an instance
``forward`` on one of the modules the input passes through. Where one of these is present, the call goes to
the model's own code, which then raises or serves exactly as it would unoptimized.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn
from torch.nn.modules import module as _module_globals


def autocast_on(device: torch.device) -> bool:
    """Whether `torch.autocast` is enabled for `device`'s type here (False for types autocast does not know)."""
    try:
        return torch.is_autocast_enabled(device.type)
    except RuntimeError:  # e.g. "meta": no autocast dispatch key
        return False


def input_may_be_cast(x: torch.Tensor, modules: Iterable[nn.Module]) -> bool:
    """Whether something could cast `x` before it reaches the last of `modules` (the module docstring's list)."""
    if (autocast_on(x.device) or torch.overrides.has_torch_function_unary(x)
            or torch._C._is_torch_function_mode_enabled()
            or _module_globals._global_forward_hooks or _module_globals._global_forward_pre_hooks):
        return True
    return any(m._forward_pre_hooks or m._forward_hooks or "forward" in m.__dict__ for m in modules)


def plain_weight_dtype(conv: nn.Module) -> torch.dtype | None:
    """The dtype of `conv`'s plain ``weight`` parameter, or None where it has none (a parametrization, say)."""
    weight = conv._parameters.get("weight")
    return None if weight is None else weight.dtype
