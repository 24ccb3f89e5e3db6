"""Average of an AuK stage's three parallel AMP blocks (`AuKDecoder.amp_blocks`).

Matches:  div(add(add(b1, b2), b3), divisor)      (Python's `(b1 + b2 + b3) / 3`, left to right)
Replaces: rewrite::amp_average(b1, b2, b3, divisor)
Exactness: exact (same adds in the same order, then the same division: ((b1 + b2) + b3) / 3).
Level: lossless.
Guard: b1, b2, b3 are 3-D of one shape and dtype (no broadcasting or promotion); the divisor is the int 3.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from rewrite.engine.pattern import variants
from rewrite.models.auk import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)

aten = torch.ops.aten
BLOCKS = 3


def search(b1, b2, b3, divisor):
    return aten.div.Tensor(aten.add.Tensor(aten.add.Tensor(b1, b2), b3), divisor)


def replace(b1, b2, b3, divisor):
    return torch.ops.rewrite.amp_average.default(b1, b2, b3, divisor)


def guard(match) -> str | None:
    divisor = match.scalars["divisor"]
    if type(divisor) is not int or divisor != BLOCKS:
        return f"divisor {divisor!r} is not the int {BLOCKS}"
    vals = [match.inputs[name].meta["val"] for name in ("b1", "b2", "b3")]
    first = vals[0]
    for value in vals:
        if value.dim() != 3 or value.dtype != first.dtype or not all(
                statically_known_true(a == b) for a, b in zip(value.shape, first.shape)):
            return f"blocks {[tuple(v.shape) for v in vals]} {[v.dtype for v in vals]} differ in shape or dtype"
    return None


PATTERNS = variants(search, replace, guard, name="amp_average", exactness="exact", level="lossless",
                    scalars=("divisor",), module_types=("AuKDecoder",))
