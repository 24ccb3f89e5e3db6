"""Triton device functions for the index math the 5-D Wan kernels share (logical positions, planes)."""

from __future__ import annotations

from rewrite.ops.dispatch import triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def position(i, C, T, H, W):
        """Logical (b, c, t, h, w) of flat index i in a [B, C, T, H, W] row-major enumeration."""
        w = i % W
        r = i // W
        h = r % H
        r = r // H
        t = r % T
        r = r // T
        return r // C, r % C, t, h, w

    @triton.jit
    def plane_coords(plane, C, T):
        """(b, c, t) of (h, w) plane number `plane` of a [B, C, T, H, W] tensor, as int64."""
        r = plane // T
        return (r // C).to(tl.int64), (r % C).to(tl.int64), (plane % T).to(tl.int64)
