"""Launching the Triton kernels of `rewrite.ops`: one helper that passes the compile flags of the kernel's
exactness class, and the grids and tiles the kernel modules share.

Every launch goes through `launch` (no module writes ``kernel[grid](...)`` itself):

- ``exact`` kernels (the default) compile with ``enable_fp_fusion=False`` (no FMA contraction: ATen's
  kernels round every product they materialize) and, where this Triton has the option,
  ``enable_reflect_ftz=False`` (libdevice without flush-to-zero, as nvcc builds PyTorch by default, so a
  libdevice call such as ``expf`` runs the code ATen's kernels run);
- ``tolerance`` kernels (``exact=False``: the AuK alias-free activation and the Triton conv1d with its
  weight packing and split sums, level ``channels_last``) compile with FMA contraction on
  (``enable_fp_fusion=True``, Triton's default, which their accuracy was measured with) and Triton's
  default libdevice flags.

Inside `rewrite.ops.compile_ahead.compile_ahead` a launch only submits its compile.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from rewrite.ops import compile_ahead
from rewrite.ops.dispatch import triton

TOLERANCE_FLAGS = {"enable_fp_fusion": True}


@functools.lru_cache(maxsize=None)
def exact_flags() -> dict:
    """``enable_fp_fusion=False``, and ``enable_reflect_ftz=False`` where this Triton's CUDA backend has it."""
    flags = {"enable_fp_fusion": False}
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        if "enable_reflect_ftz" in CUDAOptions.__dataclass_fields__:
            flags["enable_reflect_ftz"] = False
    except Exception:  # pragma: no cover - a Triton without the NVIDIA backend (the interpreter needs none)
        pass
    return flags


def launch(kernel: Any, grid: tuple, *args: Any, exact: bool = True, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)`` with the flags of its exactness class (module docstring), or inside a
    compile-ahead pass only its compile. The flags are this helper's alone: a caller passing one is an error."""
    compile_ahead.launch(kernel, grid, *args, **(exact_flags() if exact else TOLERANCE_FLAGS), **kwargs)


# ---- grids --------------------------------------------------------------------------------------------------
BLOCK = 1024  # elements per program of the flat elementwise kernels


def launch_flat(kernel: Any, numel: int, *args: Any, **constexprs: Any) -> None:
    """An exact kernel over `numel` elements, BLOCK per program on a 1-D grid (nothing for none)."""
    if numel:
        launch(kernel, (triton.cdiv(numel, BLOCK),), *args, BLOCK=BLOCK, **constexprs)


def plane_grid(b: int, c: int, t: int, spatial: int) -> tuple[int, int]:
    """One (b, c, t) plane per program along axis 0, BLOCK of its `spatial` positions along axis 1."""
    return (b * c * t, triton.cdiv(spatial, BLOCK))


# ---- tiles --------------------------------------------------------------------------------------------------
class Tile(NamedTuple):
    """A tile of the channels-last data-movement kernels: `positions` along w (or (h, w)) by `channels`
    (0: by the channel count, `block_channels`), on `warps` warps."""

    positions: int
    channels: int
    warps: int

    def block_channels(self, channels: int) -> int:
        """The tile's channels, or 64 where that divides the channel count (or it is large), else 32."""
        if self.channels:
            return self.channels
        return 64 if channels % 64 == 0 or channels > 256 else 32


class FlatBlock(NamedTuple):
    """A 1-D tile: `values` per program, on `warps` warps."""

    values: int
    warps: int
