"""`rewrite.ops.cache_into`: the ops that write their next caches into the old caches' buffers.

Every case of every declared op (`tests.op_cases`, channels-last caches, as the runtime's static buffers
are) runs plainly and through `write_next_caches_into` with its cache arguments as the buffers: every output
is `torch.equal` to the plain call's, the buffers end holding the next caches, and where the kernel path
serves a step of two frames or more the pad kernel was handed the buffer (no copy). Kernel paths run under
the Triton interpreter with the GPU-only gates opened; elsewhere the reference paths run and the buffers are
filled by copies.
"""

from __future__ import annotations

import pytest
import torch

from rewrite.ops import cache_into  # noqa: F401
from rewrite.kernels.norm import rms_norm as triton_norm  # noqa: F401
from rewrite.kernels.norm import one_pass as triton_norm_fast  # noqa: F401
from rewrite.kernels.pad import causal_pad as triton_pad  # noqa: F401
from rewrite.models.wan import ops as wan  # noqa: F401
from rewrite.models.wan import ops_fast as wan_fast  # noqa: F401
from rewrite.ops.dispatch import INTERPRETING
from tests import quick
from tests.op_cases import CASES, channels_last, grid_group, kernel_gates_open

WRITERS = cache_into.next_cache_writers()
ALL = [(op, case) for op, cases in sorted(CASES.items()) if f"rewrite::{op}" in WRITERS for case in cases]


def _two_frame_step(case) -> bool:
    """A steady step of two frames or more (not `steady_t1`, not `chunk0`): its kernel path writes in place."""
    return case.id.startswith("steady_") and not case.id.startswith("steady_t1")


def test_the_fused_norm_conv_ops_are_declared():
    assert set(WRITERS) == {"rewrite::rms_norm_causal_conv3d", "rewrite::rms_norm_causal_conv3d_fast",
                            "rewrite::rms_norm_causal_conv3d_pair_fast", "rewrite::rms_norm_causal_conv3d_pair_fast_chain"}


def _with_channels_last_caches(op, args):
    """The case's arguments with each cache argument a channels-last copy, and {output index: that copy}."""
    overload = getattr(torch.ops.rewrite, op).default
    names = [a.name for a in overload._schema.arguments]
    args = list(args)
    buffers = {}
    for index, name in WRITERS[f"rewrite::{op}"].items():
        position = names.index(name)
        if isinstance(args[position], torch.Tensor):
            args[position] = buffers[index] = channels_last(args[position].clone())
    return overload, args, buffers


# quick run: one case of each op, cache mode and path (`tests.quick`)
GRID = quick.grid([(op, case, kernels) for kernels in (False, True) for op, case in ALL],
                  lambda v: (*grid_group(v[0], v[1]), v[2]), 1, unpack=True,
                  ids=lambda v: f"{v[0]}-{v[1].id}-{'kernels' if v[2] else 'reference'}")


@pytest.mark.parametrize("op, case, kernels", GRID)
def test_writing_into_the_buffers_gives_the_ops_outputs(kernel_allowed_on_cpu, monkeypatch, kernels, op, case):
    if kernels:
        if not INTERPRETING:
            pytest.skip("needs TRITON_INTERPRET=1 (the kernel paths on CPU)")
        kernel_gates_open(monkeypatch)
    handed = []
    original = triton_pad.causal_pad_rest_channels_last

    def pad_rest(x, cache, pad, next_cache=None):
        handed.append(next_cache)
        return original(x, cache, pad, next_cache)
    for module in (triton_pad, triton_norm, triton_norm_fast):  # the norm modules import it by name
        monkeypatch.setattr(module, "causal_pad_rest_channels_last", pad_rest)
    overload, args, buffers = _with_channels_last_caches(op, case.args)
    with torch.no_grad():
        expected = overload(*args)
        handed.clear()
        indices = tuple(buffers)
        actual = cache_into.write_next_caches_into(overload, indices, tuple(buffers.values()), *args)
    assert len(actual) == len(expected)
    for index, (a, e) in enumerate(zip(actual, expected)):
        assert torch.equal(a, e), index
        if index in buffers:
            assert a is buffers[index]
    written_in_place = [b for b in handed if any(b is buffer for buffer in buffers.values())]
    frames = case.args[0].shape[2]
    if kernels and _two_frame_step(case):
        assert buffers and written_in_place, "the kernel path of a two-frame step writes a next cache in place"
    if frames < 2:
        assert not written_in_place  # one frame: the pad kernel writes next-cache rows from the old cache


def test_nested_ops_get_no_buffers(kernel_allowed_on_cpu, monkeypatch):
    """The pair op off its kernel path runs two fast ops through the dispatcher: they must return new tensors
    (a custom op may not return its input), and the pair's buffers still end holding its next caches."""
    kernel_gates_open(monkeypatch)
    monkeypatch.setattr(wan_fast, "pair_reason", lambda *a, **k: "declined for the test")
    case = next(c for c in CASES["rms_norm_causal_conv3d_pair_fast"] if c.id.startswith("steady_x"))
    overload, args, buffers = _with_channels_last_caches("rms_norm_causal_conv3d_pair_fast", case.args)
    with torch.no_grad():
        expected = overload(*args)
        actual = cache_into.write_next_caches_into(overload, tuple(buffers), tuple(buffers.values()), *args)
    assert all(torch.equal(a, e) for a, e in zip(actual, expected))


def test_a_buffer_that_is_not_the_cache_is_not_written_by_the_kernels():
    cache = channels_last(torch.randn(1, 4, 2, 3, 5))
    x = torch.randn(1, 4, 2, 3, 5)
    assert cache_into.buffer_for(cache, cache, x) is cache
    assert cache_into.buffer_for(cache.clone(), cache, x) is None  # another tensor: the copy path
    assert cache_into.buffer_for(cache, cache, x[:, :, :1]) is None  # one frame
    assert cache_into.buffer_for(cache.contiguous(), cache.contiguous(), x) is None  # not channels-last
    assert cache_into.buffer_for(None, cache, x) is None


def test_the_pad_kernel_refuses_to_write_over_a_cache_it_still_reads():
    cache = channels_last(torch.randn(1, 4, 2, 3, 5))
    with pytest.raises(ValueError, match="two frames"):
        triton_pad.causal_pad_rest_channels_last(torch.randn(1, 4, 1, 3, 5), cache, [1, 1, 1, 1, 0, 0], cache)


def test_every_op_has_two_frame_cases():
    """So that the test above checks a write in place for each declared op."""
    ops = {op for op, case in ALL if _two_frame_step(case)}
    assert ops == {name.split("::")[1] for name in WRITERS}
