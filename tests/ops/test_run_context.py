"""`rewrite.ops.run_context`: the ops' settings live in one context variable, set for a block, per thread.

Behavioural: what a block sets is seen inside it and undone after it, and a setting made in one thread is not
seen by another (a packed-weight cache set by one thread's decode must not reach another thread's ops).
Structural: the module-level switches that it replaces are gone.
"""

from __future__ import annotations

import threading

import pytest
import torch

from rewrite.ops import compile_ahead, dispatch, run_context
from rewrite.models.auk import alias_free
from rewrite.kernels import layout
from rewrite.kernels.conv1d import conv1d as triton_conv1d
from rewrite.kernels import valid_length
from rewrite.ops.run_context import RunContext


def _settings_seen_here() -> dict:
    """Each setting as the module that reads it sees it now."""
    return {"backend": dispatch.get_backend(), "compile_ahead": compile_ahead.active(),
            "valid_frames": valid_length.kernel_args(40, torch.device("cpu"))[1:],
            "context": run_context.current()}


DEFAULTS = {"backend": "auto", "compile_ahead": False, "valid_frames": (0, 0), "context": RunContext()}


def test_a_setting_made_in_one_thread_is_not_seen_by_another():
    cache = triton_conv1d.PackedWeightCache()
    frames = torch.tensor([3], dtype=torch.int32)
    inside, release, seen = threading.Event(), threading.Event(), {}

    def decode():
        with triton_conv1d.packed_weight_cache(cache), valid_length.valid_frames(frames, 10, 1), \
                dispatch.use_backend("reference"), run_context.using(compile_ahead=True, fused_norm=False,
                                                                     triton_conv1d=False):
            inside.set()
            release.wait(30)
            seen["inside"] = _settings_seen_here()
        seen["after"] = _settings_seen_here()

    worker = threading.Thread(target=decode)
    worker.start()
    assert inside.wait(30)
    try:
        assert _settings_seen_here() == DEFAULTS  # this thread, while the other holds its settings
        other = {}
        bystander = threading.Thread(target=lambda: other.update(_settings_seen_here()))
        bystander.start()
        bystander.join(30)
        assert other == DEFAULTS  # a third thread, started meanwhile
    finally:
        release.set()
        worker.join(30)
    assert seen["inside"]["context"] == RunContext(backend="reference", fused_norm=False, triton_conv1d=False,
                                                   packed_weights=cache,
                                                   valid_frames=run_context.ValidFrames(frames, 10, 1),
                                                   compile_ahead=True)
    assert seen["inside"]["valid_frames"] == (4, 4) and seen["inside"]["backend"] == "reference"
    assert seen["after"] == DEFAULTS


def test_blocks_nest_and_restore_what_was_set_before():
    with run_context.using(fused_norm=False):
        with dispatch.use_backend("triton"):
            assert run_context.current() == RunContext(backend="triton", fused_norm=False)
            dispatch.set_backend("reference")  # until the enclosing block ends
            assert dispatch.get_backend() == "reference"
        assert run_context.current() == RunContext(fused_norm=False)
    assert run_context.current() == RunContext()
    with pytest.raises(ValueError, match="unknown backend"):
        dispatch.set_backend("cuda")
    assert dispatch.get_backend() == "auto"


def test_the_module_switches_it_replaces_are_gone():
    for module, name in ((dispatch, "_backend"), (compile_ahead, "_active"), (valid_length, "_active"),
                         (triton_conv1d, "_cache"), (alias_free, "TRITON_CONV"), (layout, "FUSED_NORM")):
        assert not hasattr(module, name), f"{module.__name__}.{name}"


@pytest.mark.skipif(not dispatch.INTERPRETING, reason="needs TRITON_INTERPRET=1")
def test_the_triton_conv1d_setting_sends_the_fused_op_to_atens_conv(kernel_allowed_on_cpu, monkeypatch):
    from rewrite.models.auk import ops as _auk_ops  # noqa: F401  (registers rewrite::causal_conv1d)
    from rewrite.models.auk.alias_free_reference import alias_free_snake_causal_conv1d_reference
    from rewrite.models.auk.model import AliasFreeSnakeBeta

    calls, original = [], triton_conv1d.causal_conv1d
    monkeypatch.setattr(triton_conv1d, "causal_conv1d",
                        lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    g = torch.Generator().manual_seed(0)
    module = AliasFreeSnakeBeta(16)
    x = torch.randn(1, 16, 12, generator=g)
    weight = torch.randn(16, 16, 3, generator=g) / 7
    args = (x, module.act.alpha.detach(), module.act.beta.detach(), module.taps, True, weight, None, [1], None)
    with torch.no_grad():
        fused = torch.ops.rewrite.alias_free_snake_causal_conv1d.default(*args)
        assert calls == [1]  # chosen for this weight: the Triton conv
        with run_context.using(triton_conv1d=False):
            aten_conv = torch.ops.rewrite.alias_free_snake_causal_conv1d.default(*args)
        assert calls == [1]
        with dispatch.use_backend("reference"):
            expected = alias_free_snake_causal_conv1d_reference(*args)
    # the activation kernel's tolerance (fp32, 16 eps32 * max|y|: tests/models/auk/test_alias_free.py); the Triton
    # conv's TF32 products add up to 2**-10 relative per product
    assert torch.allclose(aten_conv, expected, rtol=0, atol=1e-5 * expected.abs().max().item())
    assert torch.allclose(fused, expected, rtol=0, atol=5e-3 * expected.abs().max().item())
