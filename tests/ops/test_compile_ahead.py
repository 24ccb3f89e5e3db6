"""rewrite.ops.compile_ahead: launches become parallel compiles inside the context, and only there."""

from __future__ import annotations

import logging

import pytest

from rewrite.ops import compile_ahead


class FakeKernel:
    def __init__(self):
        self.launched, self.warmed = [], []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launched.append((grid, args, kwargs))

    def warmup(self, *args, grid, **kwargs):
        self.warmed.append((grid, args, kwargs))


class FakeAsyncMode:
    """Stands for Triton's AsyncCompileMode: records the executor, the exit, and can fail on exit."""

    instances: list = []

    def __init__(self, executor, fail=False):
        self.executor, self.exited, self.fail = executor, False, fail
        FakeAsyncMode.instances.append(self)

    def submit(self, key, compile_fn, finalize_fn, cleanup_fn):
        self.submitted = (key, compile_fn, finalize_fn, cleanup_fn)
        return "future"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.exited = True
        if self.fail:
            raise RuntimeError("ptxas said no")


@pytest.fixture
def fake_triton(monkeypatch):
    FakeAsyncMode.instances.clear()
    monkeypatch.setattr(compile_ahead, "available", lambda: True)
    monkeypatch.setattr(compile_ahead, "AsyncCompileMode", FakeAsyncMode)
    return FakeAsyncMode


def test_launches_compile_inside_and_run_outside(fake_triton):
    kernel = FakeKernel()
    compile_ahead.launch(kernel, (3,), 1, 2, BLOCK=4)
    with compile_ahead.compile_ahead(workers=2) as active:
        assert active
        compile_ahead.launch(kernel, (5, 1), "x", BLOCK=8)
        with compile_ahead.compile_ahead() as nested:  # re-entry is a no-op, the outer one stays active
            assert not nested
            compile_ahead.launch(kernel, (6,), "y")
    compile_ahead.launch(kernel, (7,), "z")
    assert kernel.launched == [((3,), (1, 2), {"BLOCK": 4}), ((7,), ("z",), {})]
    assert kernel.warmed == [((5, 1), ("x",), {"BLOCK": 8}), ((6,), ("y",), {})]
    assert len(fake_triton.instances) == 1 and fake_triton.instances[0].exited


def test_a_failed_compile_is_logged_and_a_body_error_propagates(fake_triton, monkeypatch, caplog):
    monkeypatch.setattr(compile_ahead, "AsyncCompileMode", lambda executor: FakeAsyncMode(executor, fail=True))
    with caplog.at_level(logging.WARNING, logger="rewrite.ops.compile_ahead"):
        with compile_ahead.compile_ahead():
            pass
    assert "ptxas said no" in caplog.text
    with pytest.raises(ValueError, match="graph broke"):
        with compile_ahead.compile_ahead():
            raise ValueError("graph broke")
    assert not compile_ahead.active() and fake_triton.instances[-1].exited


def test_inactive_without_async_compilation(monkeypatch):
    monkeypatch.setattr(compile_ahead, "available", lambda: False)
    kernel = FakeKernel()
    with compile_ahead.compile_ahead() as active:
        compile_ahead.launch(kernel, (1,), "a")
    assert not active and kernel.launched == [((1,), ("a",), {})] and not kernel.warmed


@pytest.mark.gpu
def test_compile_jobs_also_build_the_launcher(fake_triton, monkeypatch):
    """The pool's compile job is Triton's compile followed by building that kernel's launcher; the callbacks
    pass through unchanged."""
    built = []
    monkeypatch.setattr(compile_ahead, "_build_launcher", lambda kernel: built.append(kernel) or kernel)
    with compile_ahead.compile_ahead(workers=1):
        mode = fake_triton.instances[-1]
        finalize, cleanup = object(), object()
        assert mode.submit("key", lambda: "compiled kernel", finalize, cleanup) == "future"
    key, job, *callbacks = mode.submitted
    assert (key, callbacks) == ("key", [finalize, cleanup]) and built == []
    assert job() == "compiled kernel" and built == ["compiled kernel"]


def test_a_launcher_that_cannot_be_built_is_left_to_the_launch(caplog):
    """A kernel object the driver cannot build a launcher for comes back unchanged, with a debug line."""
    kernel = object()
    with caplog.at_level(logging.DEBUG, logger="rewrite.ops.compile_ahead"):
        assert compile_ahead._build_launcher(kernel) is kernel
    assert "building the launcher ahead failed" in caplog.text


def test_kernels_compiled_ahead_then_run_correctly():
    """On CUDA: the conv launched inside the context only compiles (no error, nothing required of its
    output); the same call afterwards runs the compiled kernel: within TF32 tolerance of an fp64 conv, per sample
    ``2**-9 * (|w| * |x|)`` (the unrounded input truncated to TF32 by the tensor cores, up to 2**-10 relative,
    the packed weight rounded, up to 2**-11: a product within 1.5 * 2**-10; the fp32 sum adds far less)."""
    import torch
    import torch.nn.functional as F

    from rewrite.kernels.conv1d import conv1d as triton_conv1d

    if not compile_ahead.available():
        pytest.skip("this Triton has no AsyncCompileMode")
    torch.manual_seed(0)
    x = torch.randn(2, 8 + 41, 16, device="cuda")  # [B, left + T, C], K = 5, dilation 2 (a variant nothing else uses)
    weight = torch.randn(32, 16, 5, device="cuda") / 8
    with compile_ahead.compile_ahead() as active:
        assert active
        triton_conv1d.causal_conv1d(x, triton_conv1d.pack_weight(weight), None, 2)
    got = triton_conv1d.causal_conv1d(x, triton_conv1d.pack_weight(weight), None, 2)
    want = F.conv1d(x.transpose(1, 2).double(), weight.double(), dilation=2)
    assert got.shape == want.shape == (2, 32, 41)
    magnitude = F.conv1d(x.transpose(1, 2).double().abs(), weight.double().abs(), dilation=2)
    assert ((got.double() - want).abs() <= 2 ** -9 * magnitude).all()
