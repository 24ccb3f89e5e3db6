"""The contract under real use on CUDA: warm modules shared by threads, callers on other CUDA streams.

A module's CUDA graphs replay over static input, cache and output buffers that every caller shares; these
tests give each caller different latents and compare every result with the same module's single-caller
result (`torch.equal`). Shapes are large enough that a decode's GPU work outlasts the host's enqueueing, so
an unordered second caller would overlap the first one on the GPU.
"""

from __future__ import annotations

import pytest
import torch

from rewrite import optimize, report
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import build_wan
from tests.threads import run_threads

pytestmark = pytest.mark.gpu

THREADS, DECODES = 4, 6


def _wan(level: str):
    vae = optimize(build_wan("wan2.1", "tiny").to("cuda", torch.bfloat16), level)
    inputs = [torch.randn(1, 4, 4, 48, 64, generator=torch.Generator().manual_seed(s)).to("cuda", torch.bfloat16)
              for s in range(THREADS * DECODES)]
    return vae, (lambda z: vae.decode(z).sample), inputs


def _auk(level: str):
    torch.manual_seed(0)
    vae = optimize(AuKVAE(AuKConfig.tiny()).eval().to("cuda"), level, compile_shapes=(160, 320))
    inputs = [torch.randn(1, 300, vae.config.latent_dim, generator=torch.Generator().manual_seed(s)).to("cuda")
              for s in range(THREADS * DECODES)]
    return vae, vae.decode, inputs


MODELS = {"wan": _wan, "auk": _auk}


@pytest.mark.parametrize("level", ["lossless", "channels_last"])
@pytest.mark.parametrize("model", list(MODELS))
@torch.no_grad()
def test_threads_sharing_a_warm_module_each_get_their_own_answer(model, level):
    vae, decode, inputs = MODELS[model](level)
    expected = [decode(z).clone() for z in inputs]  # one caller: warm graphs, then the reference answers
    torch.cuda.synchronize()
    assert report(vae).last_path == "graphs"

    def caller(t: int) -> list[torch.Tensor]:
        outs = [decode(inputs[i]) for i in range(t * DECODES, (t + 1) * DECODES)]
        torch.cuda.current_stream().synchronize()
        return outs

    results = [out for outs in run_threads(THREADS, caller) for out in outs]
    wrong = [i for i in range(len(inputs)) if not torch.equal(results[i], expected[i])]
    assert not wrong, f"{len(wrong)} of {len(inputs)} concurrent decodes differ from the single-caller result"


@pytest.mark.parametrize("model", list(MODELS))
@torch.no_grad()
def test_a_caller_on_a_side_stream_is_ordered_after_work_on_the_default_stream(model):
    vae, decode, inputs = MODELS[model]("lossless")
    expected = [decode(z).clone() for z in inputs[:6]]
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    for attempt in range(3):
        first = decode(inputs[0])  # queued on the default stream, still running on the GPU below
        with torch.cuda.stream(side):
            z = inputs[1 + attempt] * 1.0  # latents just written by a kernel on the side stream
            second = decode(z)
            third = decode(inputs[4])
        torch.cuda.synchronize()
        assert torch.equal(first, expected[0]), attempt
        assert torch.equal(second, expected[1 + attempt]), attempt
        assert torch.equal(third, expected[4]), attempt


@torch.no_grad()
def test_two_first_decodes_at_once_on_cuda_capture_once_and_agree():
    reference = build_wan("wan2.1", "tiny").to("cuda", torch.bfloat16)
    vae = optimize(build_wan("wan2.1", "tiny").to("cuda", torch.bfloat16))
    parameters = [(n, id(p)) for n, p in vae.named_parameters()]
    inputs = [torch.randn(1, 4, 3, 8, 12, generator=torch.Generator().manual_seed(s)).to("cuda", torch.bfloat16)
              for s in range(2)]
    results = run_threads(2, lambda i: vae.decode(inputs[i]).sample)
    assert [(n, id(p)) for n, p in vae.named_parameters()] == parameters
    for i in range(2):
        assert torch.equal(results[i], reference.decode(inputs[i]).sample), i
    assert report(vae).last_path == "graphs"
