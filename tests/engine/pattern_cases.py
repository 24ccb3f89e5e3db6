"""What the pattern-engine tests share: two test custom ops (`rewrite_test::`), norm patterns over them, a small
decoder of RMS-norm blocks to capture, and helpers to capture, find a node and run both graphs."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rewrite.engine.pattern import Pattern, variants

aten = torch.ops.aten
MAX = 9223372036854775807


# --------------------------------------------------------------------------------------------- test ops


def _reference_norm(x: Tensor, gamma: Tensor, scale: float, bias: float) -> Tensor:
    """The same aten ops as the captured graph, so a reference op is bit-identical to it."""
    denom = aten.expand_as.default(aten.clamp_min.default(aten.linalg_vector_norm.default(x, 2.0, [1], True), 1e-12), x)
    return aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(aten.div.Tensor(x, denom), scale), gamma), bias)


@torch.library.custom_op("rewrite_test::rms_norm_act", mutates_args=())
def rms_norm_act(x: Tensor, gamma: Tensor, scale: float, bias: float, act: Optional[str]) -> Tensor:
    y = _reference_norm(x, gamma, scale, bias)
    return aten.silu.default(y) if act == "silu" else y


@rms_norm_act.register_fake
def _(x, gamma, scale, bias, act):
    return torch.empty_like(x)


@torch.library.custom_op("rewrite_test::rms_norm_silu_cache", mutates_args=())
def rms_norm_silu_cache(x: Tensor, gamma: Tensor, scale: float, bias: float) -> tuple[Tensor, Tensor]:
    y = aten.silu.default(_reference_norm(x, gamma, scale, bias))
    return y, y[:, :, -2:].clone()


@rms_norm_silu_cache.register_fake
def _(x, gamma, scale, bias):
    return torch.empty_like(x), torch.empty_like(x[:, :, -2:])


# --------------------------------------------------------------------------------------------- patterns


def search(x, gamma, scale, bias, act):
    norm = aten.linalg_vector_norm.default(x, 2.0, [1], True)
    denom = aten.expand_as.default(aten.clamp_min.default(norm, 1e-12), x)
    y = aten.mul.Tensor(aten.mul.Tensor(aten.div.Tensor(x, denom), scale), gamma)
    y = aten.add.Tensor(y, bias)
    return aten.silu.default(y) if act == "silu" else y


def replace(x, gamma, scale, bias, act):
    return torch.ops.rewrite_test.rms_norm_act.default(x, gamma, scale, bias, act)


def search_with_cache(x, gamma, scale, bias):
    y = search(x, gamma, scale, bias, "silu")
    return y, aten.clone.default(aten.slice.Tensor(y, 2, -2, MAX))


def replace_with_cache(x, gamma, scale, bias):
    out = torch.ops.rewrite_test.rms_norm_silu_cache.default(x, gamma, scale, bias)
    return out[0], out[1]


def norm_patterns(guard=None, **options):
    return variants(search, replace, guard, name="rms_norm_act", exactness="exact", level="lossless",
                    scalars=("scale", "bias"), module_types=("RMSNorm",), act=("silu", None), **options)


NORM_SILU, NORM_ONLY = norm_patterns()
NORM_CACHE = Pattern(name="rms_norm_silu_cache", search=search_with_cache, replace=replace_with_cache,
                     exactness="exact", level="lossless", scalars=("scale", "bias"))


# --------------------------------------------------------------------------------------------- models


class RMSNorm(nn.Module):
    def __init__(self, channels: int, scale: float, gamma_first: bool = False):
        super().__init__()
        self.gamma = nn.Parameter(torch.randn(channels, 1, 1, 1))
        self.scale, self.gamma_first = scale, gamma_first

    def forward(self, x):
        y = F.normalize(x.float(), dim=1).to(x.dtype) * self.scale
        return (self.gamma * y if self.gamma_first else y * self.gamma) + 0.0


class Block(nn.Module):
    def __init__(self, channels=4, scale=2.0, act="silu", cache=False, gamma_first=False):
        super().__init__()
        self.norm1 = RMSNorm(channels, scale, gamma_first)
        self.act = nn.SiLU() if act == "silu" else nn.ReLU() if act == "relu" else nn.Identity()
        self.cache = cache

    def forward(self, x):
        y = self.act(self.norm1(x))
        return (y, y[:, :, -2:].clone()) if self.cache else (y,)


class Decoder(nn.Module):
    def __init__(self, *blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x):
        extra = []
        for block in self.blocks:
            x, *cache = block(x)
            extra += cache
        return (x, *extra)


def canonical(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """What canonicalize does to these graphs: drop metadata asserts and same-dtype `to`."""
    for node in list(gm.graph.nodes):
        if node.target is aten._assert_tensor_metadata.default:
            gm.graph.erase_node(node)
        elif node.target is aten.to.dtype and node.args[0].meta["val"].dtype == node.meta["val"].dtype:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def capture(model: nn.Module) -> torch.fx.GraphModule:
    x = torch.randn(2, 4, 3, 5, 5)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, (x,), strict=False, dynamic_shapes=({0: batch},))
    return canonical(ep.module())


def node(gm: torch.fx.GraphModule, name: str) -> torch.fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


def run_both(model: nn.Module, gm: torch.fx.GraphModule, batch: int = 3):
    x = torch.randn(batch, 4, 3, 5, 5)
    with torch.no_grad():
        return model(x), gm(x)
