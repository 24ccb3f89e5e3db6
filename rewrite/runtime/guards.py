"""Decode-time checks that send a call to the reference path instead of the captured graphs.

Each check returns None when the captured graphs compute exactly what the reference would, else a reason
for the log and the report. None of them looks at tensor values, only at the call's context.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import itertools
import operator
from typing import Any, NamedTuple, Sequence

import torch
from torch import nn
from torch.nn.modules import module as _module_globals

from rewrite.capture.export import INSTALLED_ATTRIBUTES
from rewrite.models.input_casts import autocast_on, input_may_be_cast, plain_weight_dtype

Listing = Sequence[tuple[str, nn.Module]]  # ``region.named_modules(prefix=...)``, listed ahead


def autograd_reason(module: nn.Module, *inputs: torch.Tensor, call: str = "decode") -> str | None:
    """Autograd would record the call (a ``decode`` of latents or an ``encode`` of a video): graphs run without
    building a backward graph, so refuse."""
    if not torch.is_grad_enabled():
        return None
    advice = (f"for the graphs, {call} under torch.no_grad() or torch.inference_mode(), or call "
              "vae.requires_grad_(False)")
    if any(t.requires_grad for t in inputs):
        return f"autograd enabled and the {'video' if call == 'encode' else 'latents'} require grad ({advice})"
    if any(p.requires_grad for p in module.parameters()):
        return f"autograd enabled and the {'VAE' if call == 'encode' else 'decoder'} parameters require grad ({advice})"
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
    return f"hooks or forward wrappers inside the captured region: {_listed(hooked, 5)}"


def uniform_parameters_reason(module: nn.Module, x: torch.Tensor, region_name: str = "decoder") -> str | None:
    """Graphs are captured per (dtype, device): mixed parameters or mismatched input go to the reference."""
    kinds = {(p.dtype, p.device) for p in module.parameters()}
    if len(kinds) != 1:
        return f"{region_name} parameters have mixed dtypes/devices {sorted(map(str, kinds))}"
    dtype, device = kinds.pop()
    if x.dtype != dtype or x.device != device:
        return f"{region_name} input is {x.dtype} on {x.device}, parameters are {dtype} on {device}"
    return None


def autocast_reason(device: torch.device) -> str | None:
    """Autocast is on for the call's device: it would cast the ops of the reference decode, which the graphs
    (captured without it) do not."""
    if autocast_on(device):
        return (f"torch.autocast is enabled on {device.type}; the graphs compute in the latents' dtype (decode "
                "outside the autocast block, in the dtype you want, for the graphs)")
    return None


def refused_input_dtype(conv: nn.Module, x: torch.Tensor) -> torch.dtype | None:
    """The dtype `conv` needs of its input where its forward would raise for `x`'s (a conv's input dtype must be
    its weight's), else None: None where `x` has that dtype, where something might cast `x` before the conv
    (`rewrite.models.input_casts.input_may_be_cast`), or where `conv` has no plain `weight` parameter."""
    needed = plain_weight_dtype(conv)
    if needed is None or x.dtype == needed or input_may_be_cast(x, [conv]):
        return None
    return needed


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


def training_reason(modules: Listing) -> str | None:
    """Train mode where it changes the result: the graphs compute the eval-mode decode (`tracing_copy`).

    Mode-dependent are the torch modules whose forward reads ``training``: dropout with p > 0 (also inside
    ``nn.MultiheadAttention``), batch and instance norms, RReLU. Train mode elsewhere computes what eval
    mode computes (Wan's dropout defaults to p = 0), so the graphs still serve it."""
    active = [name for name, module in modules if module.training and _computes_differently_in_training(module)]
    if not active:
        return None
    return (f"train mode with active dropout or batch statistics in {_listed(active)}; the graphs compute the "
            "eval-mode decode (call .eval() for the graphs)")


def tensor_attribute_reason(modules: Listing) -> str | None:
    """A tensor held as a plain attribute (not a parameter or buffer): export would bake it into the graph as
    a constant, which a later assignment would not reach; the graphs read parameters and buffers by name."""
    found = [f"{name}.{key}" if name else key for name, module in modules
             for key, value in module.__dict__.items() if isinstance(value, torch.Tensor)]
    if not found:
        return None
    return f"tensors held as plain attributes, not parameters or buffers: {_listed(found)}"


def _listed(items: list[str], most: int = 3) -> str:
    """The first `most` items, joined, and how many more there are."""
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def _computes_differently_in_training(module: nn.Module) -> bool:
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return module.p > 0
    if isinstance(module, nn.MultiheadAttention):
        return module.dropout > 0
    return isinstance(module, (nn.modules.batchnorm._NormBase, nn.RReLU))


#: a plain module's own ``__dict__`` entries (parameters, hooks, ...): not settings of what it computes
_MODULE_INTERNALS = frozenset(nn.Module().__dict__) | frozenset(INSTALLED_ATTRIBUTES)
_PLAIN_TYPES = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.memory_format,
                enum.Enum)


def _is_plain(value: Any) -> bool:
    if isinstance(value, (tuple, list, frozenset)):
        return all(map(_is_plain, value))
    return isinstance(value, _PLAIN_TYPES)


def module_settings(module: nn.Module) -> dict[str, Any]:
    """The non-tensor attributes of `module` that its forward may read: plain values (numbers, strings,
    dtypes, enums, tuples/lists of them) in its ``__dict__``, e.g. a conv's ``padding_mode`` and
    ``_padding``, an RMS norm's ``scale``. Lists are copied, so an edit in place shows as a change."""
    return {name: list(value) if isinstance(value, list) else value for name, value in module.__dict__.items()
            if name not in _MODULE_INTERNALS and _is_plain(value)}


@dataclasses.dataclass
class ModuleSnapshot:
    """What a capture read of a module tree besides tensor values: each module's type, children, which
    parameters and buffers are set (not None) and its `module_settings`. `changes(listing)` names what
    differs now (an activation swapped for another type, ``conv.bias = None``, a parametrization (which
    changes the module's type), a conv's ``padding_mode``, an added or removed submodule)."""

    entries: dict[str, "_ModuleShape"]

    @classmethod
    def of(cls, listing: Listing) -> "ModuleSnapshot":
        return cls({name: _describe(module) for name, module in listing})

    def changes(self, listing: Listing, shown: int = 3) -> list[str]:
        now = {name: _describe(module) for name, module in listing}
        found = []
        for name in sorted(set(now) | set(self.entries)):
            before, after = self.entries.get(name), now.get(name)
            if before is None or after is None:
                found.append(f"{name} {'added' if before is None else 'removed'}")
                continue
            if before.type is not after.type:  # another module: its own settings are not an edit
                found.append(f"{name} type: {before.type.__name__} -> {after.type.__name__}")
                continue
            for label in ("children", "parameters", "buffers"):
                if getattr(before, label) != getattr(after, label):
                    found.append(f"{name} {label}: {getattr(before, label)!r} -> {getattr(after, label)!r}")
            for key in sorted(set(before.settings) | set(after.settings)):
                old, new = before.settings.get(key, "<unset>"), after.settings.get(key, "<unset>")
                if old != new:
                    found.append(f"{name}.{key}: {old!r} -> {new!r}")
            if len(found) > shown:
                break
        return found[:shown] + (["and more"] if len(found) > shown else [])


class _ModuleShape(NamedTuple):
    type: type
    children: tuple[str, ...]
    parameters: tuple[str, ...]  # those set (not None)
    buffers: tuple[str, ...]
    settings: dict[str, Any]


def _describe(module: nn.Module) -> _ModuleShape:
    return _ModuleShape(type(module), tuple(module._modules),
                        tuple(k for k, v in module._parameters.items() if v is not None),
                        tuple(k for k, v in module._buffers.items() if v is not None), module_settings(module))


class AcceptedState:
    """What the full guards of a decode accepted, re-checked on later calls in C-level loops (``map`` over
    prepared lists: tens of nanoseconds per entry, where the Python walk of the full checks costs about a
    millisecond per decode on the GPU machine's host).

    `holds(region)` is True while: `region` is the same module object; no global module hook; no hook in any
    of the listed modules' hook dicts (``register_*_hook`` adds to those dicts in place); every module has
    the type it had, the same instance ``forward`` (none, or the one `optimize` installed), the same
    `module_settings` values, and the same ``training`` flag where the mode changes the result
    (`training_reason`); every child that holds no graph weight is the same object and every container
    holds as many children; parameters and buffers that were None still are; the module-tree edges
    leading to the weights hold the same children and every weight name the same tensor with the same data
    pointer (`CapturedGraph.weight_locations`). When it is False the caller runs its full checks, which
    word the reason (and list the region's modules again). Not covered, as in the full checks: hook dicts
    replaced wholesale (not an API), attributes that are not plain values (`module_settings`), parameters
    or buffers added to a leaf module that its forward does not read.
    """

    def __init__(self, region: nn.Module, modules: Listing, locations) -> None:
        self.region = region
        listed = [m for _, m in modules]
        self.listed, self.types = listed, list(map(type, listed))
        self.hook_dicts = [d for m in listed for d in (m._forward_hooks, m._forward_pre_hooks,
                                                        m._backward_hooks, m._backward_pre_hooks)]
        # One flat list of (dict, key) -> expected value: instance forwards, settings, mode flags, weightless
        # children and unset parameters/buffers, compared with `==` (identity for modules and functions).
        weight_edges = set(zip(map(id, locations.edge_dicts), locations.edge_names))
        entries: list[tuple[dict, str, Any]] = []
        for m in listed:
            entries.append((m.__dict__, "forward", m.__dict__.get("forward", _MISSING)))
            entries.extend((m.__dict__, key, value) for key, value in module_settings(m).items())
            if _computes_differently_in_training(m) or isinstance(m, nn.modules.dropout._DropoutNd):
                entries.append((m.__dict__, "training", m.training))
            entries.extend((m._modules, name, child) for name, child in m._modules.items()
                           if (id(m._modules), name) not in weight_edges)
            for members in (m._parameters, m._buffers):
                entries.extend((members, name, None) for name, value in members.items() if value is None)
        self.entry_dicts = [d for d, _, _ in entries]
        self.entry_keys = [k for _, k, _ in entries]
        self.entry_values = copy.deepcopy([v for _, _, v in entries], {id(v): v for _, _, v in entries
                                                                       if not _is_plain(v)})
        self.containers = [m._modules for m in listed if m._modules]
        self.container_sizes = list(map(len, self.containers))
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
        if any(self.hook_dicts) or list(map(type, self.listed)) != self.types:
            return False
        try:
            if list(map(dict.get, self.entry_dicts, self.entry_keys, itertools.repeat(_MISSING))) != self.entry_values:
                return False
        except RuntimeError:  # a tensor where a plain value was: its `==` gives no single bool
            return False
        if list(map(len, self.containers)) != self.container_sizes or not self.locations.tree_unchanged():
            return False
        now = self.locations.tensors()
        if not all(map(operator.is_, now, self.tensors)):
            return False
        return list(map(torch.Tensor.data_ptr, now)) == self.pointers


_MISSING = object()  # an entry deleted since it was accepted
