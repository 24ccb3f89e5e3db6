"""rewrite.kernels.conv1d.conv1d.PackedWeightCache: packed conv weights kept between calls and re-packed when the
weight's version counter says it changed. Runs the pack kernel under the Triton interpreter on CPU (tests/conftest.py
sets TRITON_INTERPRET=1 without CUDA), on CUDA where there is one. Packing is a copy (plus TF32 rounding for fp32):
results are compared with torch.equal against a fresh `pack_weight`."""

from __future__ import annotations

import copy
import gc

import pytest
import torch

from rewrite.ops import compile_ahead, run_context
from rewrite.models.auk import alias_free
from rewrite.kernels.conv1d import conv1d as triton_conv1d
from rewrite.kernels.conv1d.conv1d import PackedWeightCache, pack_weight, packed_weight, packed_weight_cache

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() or alias_free.INTERPRETING),
                                reason="needs CUDA or TRITON_INTERPRET=1")


@pytest.fixture
def pack_calls(monkeypatch):
    """Counts pack kernels run (pack_weight calls)."""
    calls = []
    original = triton_conv1d.pack_weight

    def counting(weight, out=None):
        calls.append(out is not None)
        return original(weight, out)

    monkeypatch.setattr(triton_conv1d, "pack_weight", counting)
    return calls


def weight(*shape):
    return torch.nn.Parameter(torch.randn(*shape, device=DEVICE), requires_grad=False)


def test_a_weight_is_packed_once_and_read_from_the_cache_after(pack_calls):
    cache, w = PackedWeightCache(), weight(16, 8, 3)
    first = cache.lookup(w)
    second = cache.lookup(w)
    assert len(pack_calls) == 1 and len(cache) == 1
    assert second.data_ptr() == first.data_ptr() and torch.equal(second, pack_weight(w))


def test_an_in_place_update_is_repacked_into_the_same_buffer(pack_calls):
    cache, w = PackedWeightCache(), weight(16, 8, 3)
    before = cache.lookup(w)
    with torch.no_grad():
        w.mul_(-2.0)  # bumps the version counter, as copy_, load_state_dict and optimizer steps do
    assert cache.refresh() == 1 and cache.refresh() == 0
    after = cache.lookup(w)
    assert after.data_ptr() == before.data_ptr() and pack_calls == [False, True]
    assert torch.equal(after, pack_weight(w))
    with torch.no_grad():
        w.add_(1.0)
    assert torch.equal(cache.lookup(w), pack_weight(w))  # a lookup re-packs a stale entry too


def test_a_lookup_that_may_not_pack_never_caches(pack_calls):
    """What a CUDA graph capture sees: a fresh entry is read, a new or stale weight is packed uncached."""
    cache, w = PackedWeightCache(), weight(16, 8, 3)
    uncached = cache.lookup(w, may_pack=False)
    assert len(cache) == 0 and torch.equal(uncached, pack_weight(w))
    cached = cache.lookup(w)
    assert cache.lookup(w, may_pack=False).data_ptr() == cached.data_ptr()
    with torch.no_grad():
        w.mul_(3.0)
    stale_read = cache.lookup(w, may_pack=False)
    assert stale_read.data_ptr() != cached.data_ptr() and torch.equal(stale_read, pack_weight(w))


def test_dead_weights_leave_the_cache_and_copies_start_empty():
    cache, w = PackedWeightCache(), weight(16, 8, 3)
    cache.lookup(w)
    assert len(copy.deepcopy(cache)) == 0
    del w
    gc.collect()
    assert len(cache) == 0


def test_inference_tensors_have_no_version_counter_and_are_packed_every_call(pack_calls):
    cache = PackedWeightCache()
    with torch.inference_mode():
        w = torch.randn(16, 8, 3, device=DEVICE)
    cache.lookup(w)
    cache.lookup(w)
    assert len(cache) == 0 and len(pack_calls) == 2


def test_packed_weight_uses_the_active_cache_only_outside_compile_ahead(pack_calls):
    cache, w = PackedWeightCache(), weight(16, 8, 3)
    packed_weight(w)
    assert len(cache) == 0  # no cache active: plain packing
    with packed_weight_cache(cache):
        packed_weight(w)
        packed_weight(w)
        with run_context.using(compile_ahead=True):  # a compile-ahead pass: its pack kernels never run
            assert compile_ahead.active()
            packed_weight(weight(16, 8, 3))
    assert len(cache) == 1 and len(pack_calls) == 3
