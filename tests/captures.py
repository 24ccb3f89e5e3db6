"""The tiny Wan decoders' step graphs, exported once per test process and handed out as copies.

An export of the tiny decoder takes seconds on the CPU, and many structural tests need the same graphs
before their passes: `tiny_wan` exports each (version, dtype) once per process and returns copies that a
test may rewrite freely. The graphs carry no weights (they read them by name, `CapturedGraph.weights`), and
export does not depend on the patterns' or kernels' settings, so a copy is what the test's own export
would have been.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.fx as fx
from torch import nn

from rewrite.capture.export import CapturedGraph

_EXPORTED: dict[tuple[str, torch.dtype], tuple[nn.Module, tuple[CapturedGraph, ...]]] = {}


def copy_graph(graph: CapturedGraph) -> CapturedGraph:
    """A copy whose graph can be rewritten without touching `graph` (node meta is shared, read-only)."""
    module = fx.GraphModule(graph.graph_module, copy.deepcopy(graph.graph_module.graph))
    return dataclasses.replace(graph, graph_module=module, matches={}, declined={}, passes=[], timings={})


def tiny_wan(version: str, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, list[CapturedGraph]]:
    """`build_wan(version, "tiny")` in `dtype` (shared: read it, do not change it) and copies of its decoder's
    chunk-0 and steady graphs with symbolic sizes, exported on the CPU once per process."""
    from rewrite.models.wan.capture import capture_wan_decoder
    from rewrite.models.wan.config import build_wan

    key = (version, dtype)
    if key not in _EXPORTED:
        vae = build_wan(version, "tiny").to(dtype)
        _EXPORTED[key] = vae, tuple(capture_wan_decoder(vae.decoder, dtype, torch.device("cpu")))
    vae, graphs = _EXPORTED[key]
    return vae, [copy_graph(graph) for graph in graphs]
