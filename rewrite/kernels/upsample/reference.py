"""What the upsample kernels compute, as the ATen ops of the subgraphs they replace: the nearest-exact 2x
spatial upsample and the temporal interleave after Wan's `time_conv`. The kernels compute their output layouts
from these and the ops run them as their references. Imports no kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

aten = torch.ops.aten


# ---- nearest-exact 2x spatial upsample -----------------------------------------------------------------
def upsample_nearest2x_reference(x: Tensor, upcast: bool) -> Tensor:
    """`interpolate(x[.float()], scale_factor=2, mode="nearest-exact")[.to(x.dtype)]` with ATen's ops."""
    xf = aten.to.dtype(x, torch.float32) if upcast else x
    y = aten._upsample_nearest_exact2d.vec(xf, None, [2.0, 2.0])
    return aten.type_as.default(y, x) if upcast else y


# ---- temporal interleave after time_conv ----------------------------------------------------------------
def temporal_interleave_reference(y: Tensor) -> Tensor:
    """[b, 2c, t, h, w] -> [b, c, 2t, h, w]: channel halves become interleaved frames (Wan's upsample3d)."""
    b, c2, t, h, w = y.shape
    r = aten.reshape.default(y, [b, 2, c2 // 2, t, h, w])
    s = aten.stack.default([aten.select.int(r, 1, 0), aten.select.int(r, 1, 1)], 3)
    return aten.reshape.default(s, [b, c2 // 2, t * 2, h, w])
