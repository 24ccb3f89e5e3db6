"""Every Triton launch in rewrite.ops goes through `rewrite.kernels.launch.launch`, which passes the compile
flags of the kernel's exactness class.

Structural (read from the source: no other module subscripts a kernel with a grid or names a flag) and
behavioural (the flags a launch receives, recorded under the interpreter).
"""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from rewrite.ops import compile_ahead
from rewrite.kernels import launch as triton_launch
from rewrite.ops.dispatch import INTERPRETING

LIBRARY = pathlib.Path(__file__).resolve().parents[2] / "rewrite"
FLAGS = {"enable_fp_fusion", "enable_reflect_ftz"}
needs_interpreter = pytest.mark.skipif(not INTERPRETING or torch.cuda.is_available(),
                                       reason="CPU tensors under TRITON_INTERPRET=1")


def _calls(path: pathlib.Path):
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)]


def test_no_module_but_the_launch_helper_launches_a_kernel_or_names_a_flag():
    for path in sorted([*(LIBRARY / "kernels").rglob("*.py"), *(LIBRARY / "ops").rglob("*.py"),
                        *(LIBRARY / "models").rglob("*ops*.py"), *(LIBRARY / "models").rglob("*fast.py")]):
        name = path.relative_to(LIBRARY).as_posix()
        for call in _calls(path):
            where = f"{name}:{call.lineno}"
            if name != "ops/compile_ahead.py":  # the one `kernel[grid](...)`, below the helper
                assert not isinstance(call.func, ast.Subscript), f"{where}: kernel[grid](...) outside the helper"
            if name != "kernels/launch.py":
                assert not FLAGS & {k.arg for k in call.keywords}, f"{where}: a compile flag outside the helper"
                func = call.func
                assert not (isinstance(func, ast.Attribute) and func.attr == "launch"
                            and isinstance(func.value, ast.Name) and func.value.id == "compile_ahead"), \
                    f"{where}: compile_ahead.launch outside the helper"


def test_exact_kernels_compile_without_fma_contraction_nor_libdevice_flush_to_zero():
    flags = triton_launch.exact_flags()
    assert flags["enable_fp_fusion"] is False
    from triton.backends.nvidia.compiler import CUDAOptions

    if "enable_reflect_ftz" in CUDAOptions.__dataclass_fields__:
        assert flags["enable_reflect_ftz"] is False
    assert triton_launch.TOLERANCE_FLAGS == {"enable_fp_fusion": True}


@pytest.fixture
def launches(monkeypatch):
    """(kernel name, keyword arguments) of every launch, each still run."""
    recorded, original = [], compile_ahead.launch

    def record(kernel, grid, *args, **kwargs):
        recorded.append((kernel.__name__ if hasattr(kernel, "__name__") else kernel.fn.__name__, kwargs))
        return original(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(compile_ahead, "launch", record)
    return recorded


@needs_interpreter
def test_the_data_movement_kernels_now_get_the_exact_flags_too(launches):
    """The four launches that passed no flag before (the three causal pad kernels and the channels-last
    upsample): pure data movement, so the flags change nothing they compute."""
    from rewrite.kernels.norm import rms_norm as triton_norm
    from rewrite.kernels.pad import causal_pad as triton_pad
    from rewrite.kernels.upsample import upsample as triton_upsample

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, 2, 3, 4, generator=g)
    cache = torch.randn(1, 8, 2, 3, 4, generator=g)
    triton_pad.causal_pad(x, cache, [1, 1, 1, 1, 2, 0])
    triton_pad.causal_pad_channels_last(x, cache, [1, 1, 1, 1, 2, 0])
    triton_pad.causal_pad_rest_channels_last(x, cache, [1, 1, 1, 1, 2, 0])
    triton_upsample.upsample_nearest2x_channels_last(x[:, :, 0])
    triton_norm.silu(x)
    names = [name for name, _ in launches]
    assert names == ["_causal_pad_kernel", "_causal_pad_cl_kernel", "_causal_pad_rest_cl_kernel",
                     "_upsample2x_cl_kernel", "_silu_kernel"]
    for name, kwargs in launches:
        assert {k: kwargs[k] for k in triton_launch.exact_flags()} == triton_launch.exact_flags(), name
