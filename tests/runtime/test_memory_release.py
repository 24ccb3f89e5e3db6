"""Memory an optimized module took is given back when the module goes (issue 37's first item), on the CPU.

CUDA graphs cannot be captured on the CPU, so the runners get the eager stand-in backend
(`tests.graph_fakes.FakeGraphs`): a "capture" keeps its function and static buffers as a real capture keeps
its graph, its pool and its buffers. After the last reference to the module goes and `gc.collect()` runs,
nothing of it may stay reachable: not the runner, not its graphs, not a static buffer, not a weight. A
module-level structure holding any of them (as `rewrite.models.wan.runner`'s cache of in-place steady steps once did,
through its values' weight bindings) keeps all of it, CUDA graphs and their pools included, for the life of the
process.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from rewrite import optimize
from rewrite.models.auk.model import AuKConfig, AuKVAE
from rewrite.models.wan.config import build_wan
from rewrite.runtime.runner import installed_runner
from tests.graph_fakes import FakeGraphs

MICRO = AuKConfig(latent_dim=8, upsample_rates=(2, 2), upsample_kernel_sizes=(4, 4), upsample_initial_channel=16,
                  resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3),))


def _wan_module(level: str):
    """An optimized tiny Wan 2.1 VAE that decoded once through stand-in CUDA graphs; weak references to what it
    holds (runner, decoder, a weight, the graph modules, the static latent and cache buffers)."""
    vae = optimize(build_wan("wan2.1", "tiny"), level)
    runner = installed_runner(vae)
    runner.graph_backend = FakeGraphs()
    with torch.no_grad():
        vae.decode(torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(0)))
    [steps] = runner.cuda_graphs.entries()
    held = [runner, vae.decoder, next(vae.parameters()), steps, steps.x, *steps.caches]
    held += [graph.graph_module for pair in runner.graphs.values.values() for graph in pair]
    return vae, [weakref.ref(obj) for obj in held]


def _auk_module(level: str):
    """An optimized micro AuK VAE that decoded once through stand-in CUDA graphs, and weak references to its
    runner, decoder, a weight, its graph modules and each captured step's static inputs and outputs."""
    torch.manual_seed(0)
    vae = optimize(AuKVAE(MICRO).eval(), level, graph_backend=FakeGraphs(), compile_shapes=(64,))
    with torch.no_grad():
        vae.decode(torch.randn(1, 50, MICRO.latent_dim, generator=torch.Generator().manual_seed(0)))
    runner = installed_runner(vae)
    steps = [*runner.bucket_graphs.steps.values(), *runner.exact_graphs.steps.values()]
    assert steps
    held = [runner, vae.decoder, next(vae.parameters())]
    held += [graph.graph_module for graph in runner.graphs.values.values()]
    held += [tensor for step in steps for tensor in (*step.inputs, *step.outputs)]
    return vae, [weakref.ref(obj) for obj in held]


@pytest.mark.parametrize("model", [_wan_module, _auk_module], ids=["wan", "auk"])
@pytest.mark.parametrize("level", ["lossless", "channels_last"])
def test_a_deleted_optimized_module_leaves_nothing_of_it_alive(model, level):
    vae, refs = model(level)
    del vae
    gc.collect()
    alive = [type(ref()).__name__ for ref in refs if ref() is not None]
    assert alive == []


@pytest.mark.parametrize("model", [_wan_module, _auk_module], ids=["wan", "auk"])
def test_optimize_off_lets_the_runner_and_its_graphs_go(model):
    vae, refs = model("lossless")
    optimize(vae, "off")
    gc.collect()
    # the module, its decoder and weights stay (refs[1:3]); the runner and everything it captured go
    alive = [type(ref()).__name__ for i, ref in enumerate(refs) if i not in (1, 2) and ref() is not None]
    assert alive == []
