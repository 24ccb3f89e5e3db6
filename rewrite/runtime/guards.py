"""Decode-time checks that send a call to the reference path instead of the captured graphs.

Each check returns None when the captured graphs compute exactly what the reference would, else a reason
for the log and the report. None of them looks at tensor values, only at the call's context.
"""

from __future__ import annotations

import itertools
import operator

import torch
from torch import nn
from torch.nn.modules import module as _module_globals


def autograd_reason(module: nn.Module, *inputs: torch.Tensor) -> str | None:
    """Autograd would record the decode: graphs run without building a backward graph, so refuse."""
    if not torch.is_grad_enabled():
        return None
    if any(t.requires_grad for t in inputs):
        return "autograd enabled and the latents require grad (wrap the decode in torch.no_grad())"
    if any(p.requires_grad for p in module.parameters()):
        return "autograd enabled and the decoder parameters require grad (wrap the decode in torch.no_grad())"
    return None


def hook_reason(region: nn.Module, region_name: str, allowed_forward: object = None,
                modules: list[tuple[str, nn.Module]] | None = None) -> str | None:
    """Forward hooks or instance-level forward wrappers inside `region` (export would bake or drop them).
    `modules`: ``region.named_modules(prefix=region_name)`` listed ahead by a caller that checks on every call
    (walking the tree is most of the cost; the graphs follow the tree as captured anyway)."""
    hooked = []
    for name, mod in region.named_modules(prefix=region_name) if modules is None else modules:
        if mod._forward_hooks or mod._forward_pre_hooks or getattr(mod, "_backward_hooks", None):
            hooked.append(f"{name} (hooks)")
        instance_forward = mod.__dict__.get("forward")
        if instance_forward is not None and instance_forward is not allowed_forward:
            hooked.append(f"{name} (instance forward)")
    if _module_globals._global_forward_hooks or _module_globals._global_forward_pre_hooks:
        hooked.append("global module hooks")
    if not hooked:
        return None
    shown = ", ".join(hooked[:5]) + (f" and {len(hooked) - 5} more" if len(hooked) > 5 else "")
    return f"hooks or forward wrappers inside the captured region: {shown}"


def uniform_parameters_reason(module: nn.Module, x: torch.Tensor) -> str | None:
    """Graphs are captured per (dtype, device): mixed parameters or mismatched input go to the reference."""
    kinds = {(p.dtype, p.device) for p in module.parameters()}
    if len(kinds) != 1:
        return f"decoder parameters have mixed dtypes/devices {sorted(map(str, kinds))}"
    dtype, device = kinds.pop()
    if x.dtype != dtype or x.device != device:
        return f"decoder input is {x.dtype} on {x.device}, parameters are {dtype} on {device}"
    return None


def capture_in_progress_reason(device: torch.device) -> str | None:
    """Someone else is capturing a CUDA graph on this device: our own capture or sync would break it."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return "called inside another CUDA graph capture"
    return None


def cudnn_reason(device: torch.device) -> str | None:
    """cuDNN is switched off: the Wan lossless graphs defer conv biases into later kernels, which matches
    ATen only where cuDNN runs the convs (ATen then adds a conv bias with a separate `add_`; its other CUDA
    conv paths fold the bias into the sum)."""
    if device.type == "cuda" and not torch.backends.cudnn.enabled:
        return "cuDNN is disabled (torch.backends.cudnn.enabled is False); the graphs assume ATen's cuDNN convs"
    return None


class AcceptedState:
    """What the full guards of a decode accepted, re-checked on later calls in C-level loops (``map``/``any``
    over prepared lists: tens of nanoseconds per module or weight, where the Python walk of `hook_reason` and
    the weight lookup cost ~0.5 ms per decode on the GPU machine's host).

    `holds(region)` is True while: `region` is the same module object; no global module hook; no hook in any
    of the listed modules' hook dicts (``register_*_hook`` adds to those dicts in place); no module gained an
    instance ``forward``; the module-tree edges leading to the weights hold the same children; every weight
    name holds the same tensor object with the same data pointer (`CapturedGraph.weight_locations`). When it
    is False the caller runs its full checks, which word the reason. Not covered, as in the full checks: a
    module added deep inside the region after the listing, hook dicts replaced wholesale (not an API).
    """

    def __init__(self, region: nn.Module, modules: list[tuple[str, nn.Module]], locations) -> None:
        self.region = region
        listed = [m for _, m in modules]
        self.hook_dicts = [d for m in listed for d in (m._forward_hooks, m._forward_pre_hooks,
                                                        m._backward_hooks, m._backward_pre_hooks)]
        self.module_dicts = [m.__dict__ for m in listed]
        self.locations = locations
        self.tensors = locations.tensors()
        self.pointers = list(map(torch.Tensor.data_ptr, self.tensors))

    def __deepcopy__(self, memo: dict) -> "AcceptedState":
        """A state that never holds: a copied model's modules are new objects, checked afresh."""
        copied = AcceptedState.__new__(AcceptedState)
        copied.region = None
        return copied

    def holds(self, region: nn.Module) -> bool:
        if region is not self.region:
            return False
        if _module_globals._global_forward_hooks or _module_globals._global_forward_pre_hooks:
            return False
        if any(self.hook_dicts) or any(map(operator.contains, self.module_dicts, itertools.repeat("forward"))):
            return False
        if not self.locations.tree_unchanged():
            return False
        now = self.locations.tensors()
        if not all(map(operator.is_, now, self.tensors)):
            return False
        return list(map(torch.Tensor.data_ptr, now)) == self.pointers
