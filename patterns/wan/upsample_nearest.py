"""Nearest-exact 2x spatial upsample (`WanUpsample`: computed in fp32, cast back).

Matches:  [x.float()] -> _upsample_nearest_exact2d(., None, [2.0, 2.0]) [-> type_as(x)]
Replaces: rewrite::upsample_nearest2x(x, upcast)
Exactness: exact (at exactly 2x nearest-exact is pixel duplication; the fp32 round trip is a no-op).
Level: lossless.
Guard: x is 4-D.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten


def search(x, upcast):
    xf = aten.to.dtype(x, torch.float32) if upcast else x
    y = aten._upsample_nearest_exact2d.vec(xf, None, [2.0, 2.0])
    return aten.type_as.default(y, x) if upcast else y


def replace(x, upcast):
    return torch.ops.rewrite.upsample_nearest2x.default(x, upcast)


def guard(match) -> str | None:
    x = match.inputs["x"].meta["val"]
    return None if x.dim() == 4 else f"x is {x.dim()}-D, expected [n, c, h, w]"


PATTERNS = variants(search, replace, guard, name="upsample_nearest2x", exactness="exact", level="lossless",
                    module_types=("WanUpsample",), upcast=(True, False))
