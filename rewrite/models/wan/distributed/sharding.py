"""`optimize(vae, level, group=g, output=...)`: the Wan VAE's own `vae.decode` as a sharded decode over `g`.

`optimize` validates the two options with `sharding_for` before it touches anything installed, then calls
`set_sharding`, which installs one instance attribute, `vae.decode` (a `functools.partial` of
`sharded_decode` bound to the module and its `Sharding`), or removes it (no `group=`, or level "off").
Parameters, buffers, submodules and `state_dict()` are untouched; the runner that `optimize` installs
(`rewrite.models.wan.runner`) is independent of it.

The installed `decode(z, return_dict=True)` runs `decode_sharded(vae, z, group=..., output=...)` and wraps
what it returns as diffusers does (`DecoderOutput(sample=...)`, or a 1-tuple): so `vae.decode`, and
`vae(...)` through it, becomes a collective that every rank of the group must call, in the same order.
Where `decode_sharded` decodes single-process (a guard objects, bands too small) it calls `vae.decode`
again; on that thread the call goes to the class's `decode`, which serves it through the installed runner.

A copy (`copy.deepcopy`) shares the process group; a pickle refuses (a process group does not travel):
`optimize(vae, level)` first, or save the `state_dict()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading

from torch import nn

from rewrite.models.wan.distributed.decode import OUTPUTS, decode_sharded

#: the instance attribute that `set_sharding` installs on the VAE (shadowing the class's `decode`)
ENTRY_POINT = "decode"


@dataclasses.dataclass(frozen=True, eq=False)
class Sharding:
    """What `optimize(..., group=, output=)` asked for: the group as given and the output option."""

    group: object  # a torch.distributed ProcessGroup or a 1-D DeviceMesh
    output: str

    def __deepcopy__(self, memo: dict) -> "Sharding":
        return self  # a copy of the module decodes over the same process group

    def __reduce__(self):
        raise TypeError("a module optimized with group= cannot be pickled (a process group does not travel in "
                        "a pickle): call rewrite.optimize(vae, level) without group= first, or save its state_dict()")


def _group_error(group) -> Exception | None:
    """Why `group` is not a ProcessGroup or a 1-D DeviceMesh, or None."""
    import torch.distributed as dist

    if not dist.is_available():
        return RuntimeError("optimize: group= needs torch.distributed, which this torch build lacks")
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            return ValueError(f"optimize: group= takes a 1-D DeviceMesh; got one of {group.ndim} dimensions "
                              f"{tuple(group.shape)} (pass mesh[dim_name] for the dimension to shard over)")
        return None
    if isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:
        return ValueError("optimize: group= is GroupMember.NON_GROUP_MEMBER: this process is not a member of "
                          "that group (torch.distributed.new_group returns it to non-members)")
    if not isinstance(group, dist.ProcessGroup):
        return TypeError(f"optimize: group= must be a torch.distributed ProcessGroup or a 1-D DeviceMesh; got "
                         f"{type(group).__name__} {group!r}"[:300])
    return None


def sharding_for(module: nn.Module, shardable: bool, level: str, group, output) -> Sharding | None:
    """The `Sharding` that `optimize`'s `group=` and `output=` ask for (None without `group=`), checked:
    TypeError for a group that is no ProcessGroup or DeviceMesh or a model that is not `shardable` (not Wan's
    decoder), ValueError for a
    mesh that is not 1-D, an unknown `output`, `output=` without `group=`, or `group=` at level "off"."""
    if group is None:
        if output is not None:
            raise ValueError(f"optimize: output={output!r} is for a sharded decode; it needs group=")
        return None
    error = _group_error(group)
    if error is not None:
        raise error
    if not shardable:
        raise TypeError(f"optimize: group= is for the Wan VAE (diffusers AutoencoderKLWan); got "
                        f"{type(module).__name__}")
    if level == "off":
        raise ValueError("optimize: level 'off' leaves the module as diffusers made it; group= needs another level")
    output = "all" if output is None else output
    if output not in OUTPUTS:
        raise ValueError(f"optimize: output must be one of {', '.join(map(repr, OUTPUTS))}; got {output!r}")
    return Sharding(group, output)


def installed_sharding(module: nn.Module) -> Sharding | None:
    """The `Sharding` that `vae.decode` runs with, or None."""
    entry = module.__dict__.get(ENTRY_POINT)
    if isinstance(entry, functools.partial) and entry.func is sharded_decode:
        return entry.args[1]
    return None


def set_sharding(module: nn.Module, sharding: Sharding | None) -> None:
    """Install `vae.decode` as the sharded decode of `sharding`, or remove it (None)."""
    if installed_sharding(module) is not None:
        del module.__dict__[ENTRY_POINT]
    if sharding is not None:
        module.__dict__[ENTRY_POINT] = functools.partial(sharded_decode, module, sharding)


_INSIDE = threading.local()  # .modules: ids of the modules whose sharded decode this thread is running


@contextlib.contextmanager
def _running(module: nn.Module):
    inside = _INSIDE.__dict__.setdefault("modules", set())
    inside.add(id(module))
    try:
        yield
    finally:
        inside.discard(id(module))


def sharded_decode(vae: nn.Module, sharding: Sharding, z, return_dict: bool = True):
    """The installed `vae.decode`: `decode_sharded` with the options `optimize` was given, as diffusers'
    `decode` returns (`DecoderOutput`, or `(video,)` with `return_dict=False`; `sample` None on ranks
    other than 0 for `output="rank0"`)."""
    if id(vae) in _INSIDE.__dict__.get("modules", ()):  # decode_sharded's own single-process decode
        return type(vae).decode(vae, z, return_dict=return_dict)
    from diffusers.models.autoencoders.vae import DecoderOutput

    with _running(vae):
        video = decode_sharded(vae, z, group=sharding.group, output=sharding.output)
    return DecoderOutput(sample=video) if return_dict else (video,)
