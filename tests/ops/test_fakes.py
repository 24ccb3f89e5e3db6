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

from rewrite.models.auk import alias_free  # noqa: F401  (define the ops)
from rewrite.models.auk import ops as auk  # noqa: F401  (define the ops)
from rewrite.models.wan import ops as wan  # noqa: F401  (define the ops)
from rewrite.models.wan import ops_fast as wan_fast  # noqa: F401  (define the ops)
from rewrite.ops.dispatch import INTERPRETING, use_backend
from tests import quick
from tests.op_cases import CASES, grid_group, kernel_gates_open

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
@pytest.mark.parametrize("op, case", quick.grid(ALL, lambda v: grid_group(*v), 2, unpack=True,
                                                ids=lambda v: f"{v[0]}-{v[1].id}"))
def test_the_fake_gives_the_kernel_paths_layouts(kernel_allowed_on_cpu, monkeypatch, op, case):
    kernel_gates_open(monkeypatch)
    real = _real(op, case.args)
    assert _fake(op, case.args) == real


# ---- the causal conv fakes' plain shortcut (`rewrite.models.wan.ops._plain_causal_layouts`) -----------------------
CAUSAL_OPS = ("causal_conv_input", "causal_conv3d", "rms_norm_causal_conv3d", "rms_norm_causal_conv3d_fast",
              "rms_norm_causal_conv3d_pair_fast")


def _exact_layouts(outputs) -> list[tuple]:
    """Every size, every stride (size-1 dims too) and the storage offset, as expressions, dtype and device."""
    from rewrite.kernels.layout import _expr

    return [(tuple(map(_expr, t.shape)), tuple(map(_expr, t.stride())), _expr(t.storage_offset()), t.dtype, t.device)
            for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]


def _general(monkeypatch, fn):
    """`fn()` with the shortcut off: the fakes make every intermediate tensor (what they did before it)."""
    with monkeypatch.context() as patched:
        patched.setattr(wan, "_plain_causal_layouts", lambda *args: None)
        return fn()


def _sweep_cases():
    """Causal conv inputs beyond `op_cases`: sizes of 1 and 2 (where layouts can be confused), every layout of x
    and of the cache (channels-last with an odd size-1 stride, a view of the last frames), each mode."""
    g = torch.Generator().manual_seed(1)

    def odd_channels_last(t):  # channels-last memory, the size-1 frame dim's stride not the plain one
        b, c, _, h, w = t.shape
        return t.permute(0, 3, 4, 2, 1).reshape(b, h, w, 1, c).permute(0, 4, 3, 1, 2) if t.shape[2] == 1 else t

    layouts = {"contiguous": lambda t: t, "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last_3d),
               "frame_major": lambda t: t.permute(0, 2, 1, 3, 4).contiguous().permute(0, 2, 1, 3, 4),
               "odd_channels_last": odd_channels_last, "view": lambda t: torch.cat([t, t], 2)[:, :, 1:]}
    def odd(t):  # every size-1 dim's stride 7: addresses the same memory, says something else about the layout
        return t.as_strided(t.shape, [7 if n == 1 else s for n, s in zip(t.shape, t.stride())], t.storage_offset())

    for (b, c, h, w), frames, (mode, cached), x_lay, cache_lay, x_odd in itertools.product(
            ((2, 4, 3, 4), (1, 4, 3, 4), (2, 1, 3, 4), (2, 4, 1, 4), (1, 2, 2, 1)), (1, 2, 3),
            (("chunk0", False), ("steady_t1", True), ("steady", True), ("steady", False)), layouts, layouts,
            (False, True)):
        if (mode == "steady_t1") != (frames == 1) or (not cached and cache_lay != "contiguous"):
            continue
        x = layouts[x_lay](torch.randn(b, c, frames, h, w, generator=g))
        x = odd(x) if x_odd else x
        cache = layouts[cache_lay](torch.randn(b, c, 2, h, w, generator=g)) if cached else None
        weight = torch.randn(3, c, 3, 3, 3, generator=g)
        tag = f"b{b}c{c}h{h}w{w}_t{frames}_{mode}_x_{x_lay}{'_odd' * x_odd}_cache_{cache_lay if cached else None}"
        yield "causal_conv_input", tag, (x, cache, [1, 1, 1, 1, 2, 0], mode)
        yield "causal_conv3d", tag, (x, cache, [1, 1, 1, 1, 2, 0], mode, weight, None, None)
        yield "rms_norm_causal_conv3d", tag + "_x_bias", (x, torch.randn(c, 1, 1, 1), 2.0, 0.0, 1e-12, False, "silu",
                                                         cache, [1, 1, 1, 1, 2, 0], mode, weight, None, None,
                                                         torch.randn(c), None, False)


import itertools  # noqa: E402  (the sweep's only)

SHORTCUT = [(op, case.id, case.args) for op, case in ALL if op in CAUSAL_OPS] + list(_sweep_cases())


@pytest.mark.parametrize("op, case_id, args", SHORTCUT, ids=[f"{op}-{case_id}" for op, case_id, _ in SHORTCUT])
def test_the_plain_shortcut_gives_exactly_the_general_fakes_layouts(monkeypatch, op, case_id, args):
    def fake():
        with FakeTensorMode() as mode:
            fake_args = tree_map_only(torch.Tensor, mode.from_tensor, args)
            return _exact_layouts(getattr(torch.ops.rewrite, op).default(*fake_args))

    assert fake() == _general(monkeypatch, fake)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_plain_shortcut_serves_the_wan_graphs_symbolic_sizes_as_the_general_fakes_do(monkeypatch, device):
    """Every replacement value of tiny Wan 2.1's two graphs (symbolic batch, height and width) with the
    shortcut and without it: the same sizes and strides as expressions; the shortcut serves most causal convs."""
    from rewrite.models.wan.capture import capture_wan_decoder
    from rewrite.engine import rewriter
    from rewrite.models.wan.config import build_wan
    from rewrite.pipeline import rewrite_graph

    compute, served, compared = rewriter.fake_value, [], []
    plain, layouts = wan._plain_causal_conv3d_fake, wan._plain_causal_layouts

    def counted(*args, **kwargs):
        out = plain(*args, **kwargs)
        if wan._plain_causal_layouts is layouts:  # not a `_general` call
            served.append(out is not None)
        return out

    def checked(node, fake_mode, pattern):
        value = compute(node, fake_mode, pattern)
        if str(node.target).startswith(tuple(f"rewrite.{op}." for op in CAUSAL_OPS)):
            general = _general(monkeypatch, lambda: compute(node, fake_mode, pattern))
            compared.append((node.name, _exact_layouts(value) == _exact_layouts(general)))
        return value

    monkeypatch.setattr(rewriter, "fake_value", checked)
    monkeypatch.setattr(wan, "_plain_causal_conv3d_fake", counted)
    decoder = build_wan("wan2.1", "tiny").to(device).decoder
    for graph in capture_wan_decoder(decoder, torch.float32, torch.device(device)):
        rewrite_graph(graph, "lossless")
    assert len(compared) > 100 and [name for name, same in compared if not same] == []
    assert sum(served) >= 0.9 * len(served)
