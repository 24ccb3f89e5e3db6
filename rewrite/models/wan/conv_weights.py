"""Channels-last copies of the conv weights that channels-last custom ops read, refreshed once per decode.

The channels-last conv ops (those declared with `rewrite.ops.op_info.reads_channels_last_weight`:
`rewrite::causal_conv3d`, `rewrite::rms_norm_causal_conv3d`, `rewrite::upsample_conv2d`,
`rewrite::upsample_conv2d_dup_up_add`) hand cuDNN an NDHWC/NHWC weight. Given the module's own (contiguous)
weight they convert it on every call, and inside a CUDA graph that conversion is replayed on every step (for
Wan 2.2 about 1 GiB of weights copied per latent frame). A `ChannelsLastWeights` store
keeps one channels-last copy per weight tensor and the graphs are called with the copies in place of the
weights they replace (an op given a weight that is already channels-last converts nothing). The caller
runs `refresh(pairs)` at the start of every decode (in the chunk-0 CUDA graph), so an in-place weight
update (`load_state_dict`) reaches the next decode as it reached the uncaptured ops before.

Exactness: exact (the ops read the same values; their reference paths make the weight contiguous again).
Preconditions: a weight placeholder is substituted only when every one of its users passes it as the
declared weight argument of one of those ops (nothing else sees the changed layout).
"""

from __future__ import annotations

import weakref
from typing import Sequence

import torch
import torch.fx as fx
from torch import Tensor

import rewrite.models.wan.ops  # noqa: F401  (defines the Wan ops, which declare their channels-last weights)
from rewrite.ops import op_info

__all__ = ["ChannelsLastWeights", "channels_last_weight_slots"]


def _weight_format(weight: Tensor):
    return {5: torch.channels_last_3d, 4: torch.channels_last}.get(weight.dim())


def _is_weight_argument(user: fx.Node, placeholder: fx.Node) -> bool:
    """`placeholder` is one of `user`'s channels-last weight arguments (positional or keyword) and no other
    argument."""
    positional = [i for i, a in enumerate(user.args) if a is placeholder]
    keyword = [k for k, a in user.kwargs.items() if a is placeholder]
    return any((positional, keyword) in (([index], []), ([], [name]))
               for index, name in op_info.channels_last_weight_arguments(user.target))


def channels_last_weight_slots(graph_module: fx.GraphModule) -> list[int]:
    """Placeholder indices (call order) whose every user takes them as a channels-last op's weight."""
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    return [i for i, node in enumerate(placeholders)
            if node.users and all(_is_weight_argument(u, node) for u in node.users)]


class ChannelsLastWeights:
    """One channels-last copy per weight tensor, shared by every graph set of a runner (one set of copies
    however many shapes are captured); entries die with their weight tensor."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[weakref.ref, Tensor]] = {}

    def __deepcopy__(self, memo: dict) -> "ChannelsLastWeights":
        """An empty store: a copied model makes copies of its own weights."""
        return ChannelsLastWeights()

    def __len__(self) -> int:
        return len(self._copies)

    def substitute(self, slots: Sequence[int], weights: Sequence[Tensor | None]) -> tuple[list, list[tuple[Tensor, Tensor]]]:
        """`weights` with the channels-last copy at each of `slots` (where one applies), and the
        (weight, copy) pairs that `refresh` must bring up to date."""
        self._copies = {k: v for k, v in self._copies.items() if v[0]() is not None}
        out, pairs = list(weights), []
        for slot in slots:
            weight = weights[slot]
            fmt = None if weight is None else _weight_format(weight)
            if fmt is None or weight.is_contiguous(memory_format=fmt) or not weight.is_contiguous():
                continue
            entry = self._copies.get(id(weight))
            if entry is None or entry[0]() is not weight:
                with torch.no_grad():
                    entry = (weakref.ref(weight), weight.detach().contiguous(memory_format=fmt))
                self._copies[id(weight)] = entry
            out[slot] = entry[1]
            pairs.append((weight, entry[1]))
        return out, pairs

    @staticmethod
    def refresh(pairs: Sequence[tuple[Tensor, Tensor]]) -> None:
        """Copy each weight's current values into its channels-last copy."""
        with torch.no_grad():
            for weight, copy in pairs:
                copy.copy_(weight)

    @staticmethod
    def distinct(pairs: Sequence[tuple[Tensor, Tensor]]) -> list[tuple[Tensor, Tensor]]:
        """`pairs` with each copy once (graphs that share a weight get the same copy)."""
        return list({id(copy): (weight, copy) for weight, copy in pairs}.values())
