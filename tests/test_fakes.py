"""Every custom op of the `rewrite` namespace: its fake gives the sizes, strides and dtypes the real op gives.

The real op runs on CPU on its reference path and, where it has a Triton path, on that path under the
interpreter with the GPU-only gates opened (`tests.op_cases.kernel_gates_open`); the fake runs under
`FakeTensorMode` on the same inputs. Inputs: `tests.op_cases.CASES`, every layout each op takes (contiguous,
frame-major, channels-last, views), the optional arguments present and absent. The ops are enumerated from the
dispatcher, so an op without cases fails here. Strides are compared on every dimension of more than one element:
a size-1 dimension's stride never addresses memory, ATen's eager and meta kernels disagree about it, and
Inductor's output checks (`assert_size_stride`) ignore it too.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map_only

from rewrite.ops import alias_free, auk, wan, wan_fast  # noqa: F401  (define the ops)
from rewrite.ops.dispatch import INTERPRETING, use_backend
from tests.op_cases import CASES, kernel_gates_open

ALL = [(op, case) for op, cases in sorted(CASES.items()) for case in cases]
IDS = [f"{op}-{case.id}" for op, case in ALL]


def _layouts(outputs) -> list[tuple]:
    """(sizes, strides of the dims of more than one element, dtype) of each output."""
    return [(tuple(t.shape), tuple(s if n != 1 else None for n, s in zip(t.shape, t.stride())), t.dtype)
            for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]


def _fake(op: str, args: tuple) -> list[tuple]:
    with FakeTensorMode() as mode:
        fake_args = tree_map_only(torch.Tensor, mode.from_tensor, args)
        return _layouts(getattr(torch.ops.rewrite, op).default(*fake_args))


def _real(op: str, args: tuple) -> list[tuple]:
    with torch.no_grad():
        return _layouts(getattr(torch.ops.rewrite, op).default(*args))


def test_every_op_of_the_namespace_has_cases():
    ops = {name.split("::")[1] for name in torch._C._dispatch_get_all_op_names() if name.startswith("rewrite::")}
    assert ops == set(CASES), f"without cases: {sorted(ops - set(CASES))}; cases of no op: {sorted(set(CASES) - ops)}"
    assert all(CASES[op] for op in ops)


@pytest.mark.parametrize("op, case", ALL, ids=IDS)
def test_the_fake_gives_the_reference_paths_layouts(op, case):
    with use_backend("reference"):
        real = _real(op, case.args)
    assert _fake(op, case.args) == real


@pytest.mark.skipif(not INTERPRETING, reason="needs TRITON_INTERPRET=1 (the kernel paths on CPU)")
@pytest.mark.parametrize("op, case", ALL, ids=IDS)
def test_the_fake_gives_the_kernel_paths_layouts(kernel_allowed_on_cpu, monkeypatch, op, case):
    kernel_gates_open(monkeypatch)
    real = _real(op, case.args)
    assert _fake(op, case.args) == real
