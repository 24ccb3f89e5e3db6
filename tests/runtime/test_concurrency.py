"""Concurrent callers on CPU: captures alone, first decodes raced, warm modules shared by threads.

The GPU side (CUDA-graph buffers shared by threads, callers on other CUDA streams) is in
tests/runtime/test_concurrent_callers.py.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch

from rewrite import optimize, report
from rewrite.models.auk.capture import reference_decode
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import build_wan
from rewrite.runtime.locks import CaptureGate, ModuleLock
from tests.threads import run_threads

MICRO = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                  resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))


# ------------------------------------------------------------------------------------------ the locks


def test_a_capture_waits_for_running_decodes_and_runs_alone():
    gate, events, inside = CaptureGate(), [], []

    def decode(i):
        with gate.running():
            inside.append(i)
            time.sleep(0.05)
            events.append(("decode", len(inside)))
            inside.remove(i)

    def capture():
        with gate.capturing():
            events.append(("capture", len(inside)))

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.01)
    capture()
    for thread in threads:
        thread.join()
    assert ("capture", 0) in events  # no decode was inside while the capture ran
    assert any(kind == "decode" and count > 1 for kind, count in events)  # decodes overlapped each other


def test_a_decode_that_must_capture_gives_its_shared_hold_back_and_takes_it_again():
    gate = CaptureGate()
    with gate.running():
        done = threading.Event()

        def other_capture():
            with gate.capturing():
                done.set()

        thread = threading.Thread(target=other_capture)
        thread.start()
        time.sleep(0.05)
        assert not done.is_set()  # the other capture waits for this decode
        with gate.capturing():  # this decode's own capture: no deadlock with the waiting one
            with gate.running():  # re-entrant inside its own capture
                pass
    thread.join(timeout=120)  # returns as soon as the thread ends; the bound only guards against a deadlock
    assert done.is_set()  # the waiting capture ran once this thread's hold was given back
    with gate.capturing():  # nothing left held
        pass


def test_the_module_lock_admits_one_holder_at_a_time_and_is_re_entrant():
    lock, inside, overlaps = ModuleLock(), [], []

    def hold(i):
        with lock.holding(torch.device("cpu")):
            with lock.holding(torch.device("cpu")):  # re-entrant
                inside.append(i)
                overlaps.append(len(inside))
                time.sleep(0.01)
                inside.remove(i)

    run_threads(4, hold)
    assert overlaps == [1, 1, 1, 1]
    assert isinstance(copy.deepcopy(lock), ModuleLock)


# ------------------------------------------------------------------------------------- first decodes


def _own_parameters(module: torch.nn.Module) -> list:
    return [(name, id(p)) for name, p in module.named_parameters()]


def _assert_untouched(module, parameters_before):
    assert _own_parameters(module) == parameters_before
    for _, p in module.named_parameters():
        assert type(p) is torch.nn.Parameter and not isinstance(p.data, torch._subclasses.FakeTensor)
    for m in module.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks


@torch.no_grad()
def test_two_first_decodes_of_an_auk_model_at_once_capture_once_and_agree():
    for attempt in range(2):
        torch.manual_seed(attempt)
        reference = AuKVAE(MICRO).eval()
        vae = optimize(copy.deepcopy(reference), "lossless")
        before = _own_parameters(vae)
        z = [torch.randn(1, 30 + 7 * i, MICRO.latent_dim, generator=torch.Generator().manual_seed(i)) for i in range(2)]
        outs = run_threads(2, lambda i: vae.decode(z[i]))
        _assert_untouched(vae, before)
        for i in range(2):
            assert torch.equal(outs[i], reference_decode(reference, z[i])), (attempt, i)
        assert len(report(vae).graphs) == 1 and report(vae).last_path == "graphs"


@torch.no_grad()
def test_two_first_decodes_of_a_wan_model_at_once_capture_once_and_agree():
    reference = build_wan("wan2.1", "tiny")
    vae = optimize(build_wan("wan2.1", "tiny"))
    before = _own_parameters(vae)
    z = [torch.randn(1, 4, 2, 4, 6, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    outs = run_threads(2, lambda i: vae.decode(z[i]).sample)
    _assert_untouched(vae, before)
    for i in range(2):
        assert torch.equal(outs[i], reference.decode(z[i]).sample), i
    assert len(report(vae).graphs) == 2 and report(vae).last_path == "graphs"  # chunk0 + steady, once


@torch.no_grad()
def test_a_capture_in_one_thread_does_not_change_a_decode_in_another():
    """torch.export switches MKL-DNN (cuDNN on the GPU) off process-wide while it traces: a decode running
    meanwhile would take other convolution kernels. Captures run alone among rewrite's calls."""
    torch.manual_seed(3)
    reference = AuKVAE(MICRO).eval()
    warm = optimize(copy.deepcopy(reference), "lossless")
    z = torch.randn(1, 40, MICRO.latent_dim, generator=torch.Generator().manual_seed(5))
    expected = warm.decode(z)
    assert torch.equal(expected, reference_decode(reference, z))
    stop, results = threading.Event(), []

    @torch.no_grad()
    def keep_decoding():
        while not stop.is_set():
            results.append(torch.equal(warm.decode(z), expected))

    thread = threading.Thread(target=keep_decoding)
    thread.start()
    try:
        for seed in (1, 2):  # two captures of fresh models while the warm one decodes
            torch.manual_seed(seed)
            optimize(AuKVAE(MICRO).eval(), "lossless").decode(z)
    finally:
        stop.set()
        thread.join()
    assert results and all(results), f"{results.count(False)} of {len(results)} decodes differed"


@torch.no_grad()
@pytest.mark.parametrize("model", ["wan", "auk"])
def test_a_warm_module_shared_by_threads_gives_each_call_its_own_answer(model, wan_pair):
    if model == "wan":
        pair = wan_pair("wan2.1")
        decode = lambda z: pair.optimized.decode(z).sample  # noqa: E731
        inputs = [pair.latents(1, 2, seed=s) for s in range(6)]
    else:
        torch.manual_seed(4)
        vae = optimize(AuKVAE(MICRO).eval(), "lossless")
        decode = vae.decode
        inputs = [torch.randn(1, 20 + s, MICRO.latent_dim, generator=torch.Generator().manual_seed(s)) for s in range(6)]
    expected = [decode(z) for z in inputs]
    outs = run_threads(3, lambda i: [decode(z) for z in inputs[i:] + inputs[:i]])
    for i, got in enumerate(outs):
        for z_index, out in zip(list(range(i, 6)) + list(range(i)), got):
            assert torch.equal(out, expected[z_index]), (i, z_index)
