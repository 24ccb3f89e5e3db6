"""`rewrite.models.wan.distributed.band_segments`, in process: band step graphs cut at their collectives."""

from __future__ import annotations

import torch

from tests.models.wan.distributed.ranks import StandInSegments


def test_band_graph_segments_replay_what_the_graphs_compute():
    """A band step graph cut at its collectives: one collective piece per halo exchange and gather, compute
    pieces between them; run eagerly, and captured as segments (`StandInSegments`: unwritten outputs are NaN)
    for chunk 0 and two steady steps, it gives the graph module's frames and caches bit for bit. The
    collectives talk to a stand-in of the other rank (fixed rows, the gather returns its input)."""
    import operator

    from rewrite.models.wan.capture import export_wan_steps
    from rewrite.models.wan.distributed.band_convs import ConvForms
    from rewrite.models.wan.distributed.band_graphs import halo_first_decoder
    from rewrite.models.wan.distributed.band_ops import COLLECTIVES, BandContext
    from rewrite.models.wan.distributed.band_segments import (Collective, Compute, SegmentedBandSteps, run_split,
                                                   split_at_collectives)
    from rewrite.models.wan.distributed.bands import BandRun
    from rewrite.models.wan.config import build_wan
    from rewrite.pipeline import rewrite_graph
    from tests.op_cases import StandInNeighbour

    bf16 = torch.bfloat16
    decoder = build_wan("wan2.1", "tiny").decoder.to(bf16)
    ctx = BandContext([(0, 3), (3, 5)], 0)
    traced, _ = halo_first_decoder(decoder, ctx, ConvForms(ctx.id))
    chunk0, steady = export_wan_steps(traced, bf16, torch.device("cpu"), (1, 5, 6))
    for graph in (chunk0, steady):
        rewrite_graph(graph, "lossless")
    split = split_at_collectives(steady.graph_module)
    collectives = [n for n in steady.graph_module.graph.nodes if n.target in COLLECTIVES]
    # 24 halo exchanges (21 norms feeding a conv, 3 upsamplers) and the attention's gather
    assert [p.node for p in split.pieces if isinstance(p, Collective)] == collectives and len(collectives) == 25
    assert all(i.target is operator.getitem for p in split.pieces if isinstance(p, Collective) for i in p.items)

    ctx.run = BandRun(StandInNeighbour(), ctx.rows)  # rank 0 of 2
    try:
        g = torch.Generator().manual_seed(0)
        frames = [torch.randn((1, 4, 1, 5, 6), generator=g).to(bf16) for _ in range(3)]
        w0, w = chunk0.weights(decoder), steady.weights(decoder)
        with torch.no_grad():
            y, *caches = chunk0(w0, frames[0])
            assert all(torch.equal(a, b) for a, b in zip(run_split(split_at_collectives(chunk0.graph_module),
                                                                  chunk0.bind(w0, frames[0])), [y, *caches]))
            backend = StandInSegments()
            segments = SegmentedBandSteps(chunk0, steady, w0, w, frames[0], backend)
            computes = sum(isinstance(p, Compute) for gm in (chunk0.graph_module, steady.graph_module)
                           for p in split_at_collectives(gm).pieces)
            assert backend.captures == computes == 2 * 26  # each graph: a compute piece around every collective
            assert torch.equal(segments.first(frames[0]), y)
            for frame in frames[1:]:
                y, *caches = steady(w, frame, *caches)
                assert torch.equal(segments.next(frame), y)
                assert all(torch.equal(a, b) for a, b in zip(segments.caches, caches))
    finally:
        ctx.run = None
