"""Host-side launch helpers shared by the Wan kernel modules: the flat elementwise grid, plane grids, tiles."""

from __future__ import annotations

from rewrite.ops.dispatch import triton

BLOCK = 1024  # elements per program of the flat elementwise kernels


def flat_grid(numel: int) -> tuple[int]:
    return (triton.cdiv(numel, BLOCK),)


def launch_flat(kernel, numel: int, *args, **constexprs) -> None:
    """One program per BLOCK of `numel` elements (nothing for none)."""
    if numel:
        kernel[flat_grid(numel)](*args, BLOCK=BLOCK, enable_fp_fusion=False, **constexprs)


def plane_grid(b: int, c: int, t: int, spatial: int) -> tuple[int, int]:
    """One (b, c, t) plane per program along axis 0, BLOCK of its `spatial` positions along axis 1."""
    return (b * c * t, triton.cdiv(spatial, BLOCK))


def channel_block(channels: int, fixed: int = 0) -> int:
    """Channels per program of the channels-last kernels: `fixed`, or 64 where it divides them (or they are
    many), else 32."""
    if fixed:
        return fixed
    return 64 if channels % 64 == 0 or channels > 256 else 32
