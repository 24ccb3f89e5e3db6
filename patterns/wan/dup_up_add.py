"""Wan 2.2 `DupUp3D` shortcut plus the residual add of `WanResidualUpBlock`.

Matches:  d = view(contiguous(permute(view(repeat_interleave(x, r, 1), unfold), [0,1,5,2,6,3,7,4])), fold)
          [d = d[:, :, first_frame:]  (chunk 0 drops the frames before the first)]
          main + d
Replaces: rewrite::dup_up_add(main, x, r, unfold, fold, first_frame)
Exactness: exact (data movement and the same add).
Level: lossless.
Guard: x is 5-D, the unfold shape is 8-D, main has the shape and dtype of the add's output.
"""

from __future__ import annotations

import torch

from rewrite.engine.pattern import variants
from rewrite.models.wan import ops as _ops  # noqa: F401  (registers torch.ops.rewrite.*)
from rewrite.models.wan.reference import END

aten = torch.ops.aten


def _dup_up(x, repeats, unfold_shape, fold_shape):
    d = aten.view.default(aten.repeat_interleave.self_int(x, repeats, 1), unfold_shape)
    return aten.view.default(aten.contiguous.default(aten.permute.default(d, [0, 1, 5, 2, 6, 3, 7, 4])), fold_shape)


def search(main, x, repeats, unfold_shape, fold_shape, chunk):
    return aten.add.Tensor(main, _dup_up(x, repeats, unfold_shape, fold_shape))


def replace(main, x, repeats, unfold_shape, fold_shape, chunk):
    return torch.ops.rewrite.dup_up_add.default(main, x, repeats, unfold_shape, fold_shape, 0)


def search_first_chunk(main, x, repeats, unfold_shape, fold_shape, first_frame, chunk):
    return aten.add.Tensor(main, aten.slice.Tensor(_dup_up(x, repeats, unfold_shape, fold_shape), 2, first_frame, END))


def replace_first_chunk(main, x, repeats, unfold_shape, fold_shape, first_frame, chunk):
    return torch.ops.rewrite.dup_up_add.default(main, x, repeats, unfold_shape, fold_shape, first_frame)


def guard(match) -> str | None:
    x, main, out = match.inputs["x"].meta["val"], match.inputs["main"].meta["val"], match.outputs[0].meta["val"]
    if x.dim() != 5 or len(match.scalars["unfold_shape"]) != 8:
        return "expected a 5-D input unfolded into 8 dims"
    if tuple(main.shape) != tuple(out.shape) or main.dtype != out.dtype:
        return f"main {tuple(main.shape)} {main.dtype} would broadcast or promote into {tuple(out.shape)} {out.dtype}"
    return None


_COMMON = dict(name="dup_up_add", exactness="exact", level="lossless", module_types=("WanResidualUpBlock",))
PATTERNS = (
    variants(search, replace, guard, scalars=("repeats", "unfold_shape", "fold_shape"), chunk=("steady",), **_COMMON)
    + variants(search_first_chunk, replace_first_chunk, guard,
               scalars=("repeats", "unfold_shape", "fold_shape", "first_frame"), chunk=("first",), **_COMMON)
)
