"""`passes/canonicalize.py` on aliases: an alias feeding other nodes is dropped (exact: it is the input's own
view), one the graph returns is kept (so no output becomes its input or another output)."""

from __future__ import annotations

import torch
from torch import nn

from rewrite.passes.canonicalize import canonicalize

aten = torch.ops.aten


class AliasInside(nn.Module):
    def forward(self, x):
        return aten.alias.default(x) * 2, aten.alias.default(x + 1)


def test_inner_aliases_go_returned_aliases_stay():
    x = torch.randn(2, 3)
    gm = torch.export.export(AliasInside(), (x,), strict=False).module()
    before = [n.target for n in gm.graph.nodes].count(aten.alias.default)
    result = canonicalize(gm)
    after = [n.target for n in gm.graph.nodes].count(aten.alias.default)
    assert (before, after) == (2, 1) and result.stats["removed"] == {"alias.default": 1}
    got, want = gm(x), AliasInside()(x)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
