"""Exporting a step function (`rewrite.capture.export.export_step`): traced without the fake-tensor dispatch cache,
the process-wide flag restored."""

from __future__ import annotations

import torch


def test_export_traces_without_the_fake_tensor_cache_and_restores_the_flag():
    """`export_step` makes its fake mode without the dispatch cache (the same graph, about half the steady
    graph's export time for full-size Wan on CPU); the process-wide flag is restored afterwards."""
    from rewrite.capture.export import export_step

    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch._dynamo.config.fake_tensor_cache_enabled)
            return x * 2

    before = torch._dynamo.config.fake_tensor_cache_enabled
    graph = export_step("probe", Probe(), (torch.ones(2, 3),), dynamic_dims=(0,))
    assert seen == [False] and torch._dynamo.config.fake_tensor_cache_enabled == before
    mode = next(n.meta["val"] for n in graph.graph_module.graph.nodes if n.op == "placeholder").fake_mode
    assert not mode.cache_enabled
