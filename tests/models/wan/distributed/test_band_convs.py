"""`rewrite.models.wan.distributed.band_convs`, in process: the band forms of the spatial convs, their checks and
gathered forms."""

from __future__ import annotations

import torch


class _StandInAlone:
    """The comm of a 1-rank band decode: the halo rows are the global edges' zeros, the gather is the band."""

    rank, world, name, _global = 0, 1, "alone", (0,)

    def exchange_edges(self, first, last, what):
        return None, None

    def gather_rows(self, x, heights, what):
        return x


def test_band_conv_forms_record_check_and_gather():
    """Each spatial conv of the halo-first decoder is recorded once per call shape; its check passes where the
    band form gives the whole conv's rows and names the call where it does not; and the gathered forms (every
    conv gathered) compute what the band forms do: on one rank, where the halo rows are the zero pad and the
    gather is the band, chunk 0 and two steady steps agree bit for bit, frames and caches (tiny Wan 2.1 bf16)."""
    from rewrite.models.wan.capture import export_wan_steps
    from rewrite.models.wan.distributed.band_convs import (CAUSAL_HALO, CAUSAL_POINTWISE, RESAMPLE_HALO, ConvForms,
                                                check_call)
    from rewrite.models.wan.distributed.band_graphs import halo_first_decoder
    from rewrite.models.wan.distributed.band_ops import BandContext
    from rewrite.models.wan.distributed.bands import BandRun
    from rewrite.models.wan.config import build_wan
    from rewrite.pipeline import rewrite_graph

    bf16 = torch.bfloat16
    decoder = build_wan("wan2.1", "tiny").decoder.to(bf16)
    ctx = BandContext([(0, 3), (3, 5)], 0)
    forms = ConvForms(ctx.id)
    traced, _ = halo_first_decoder(decoder, ctx, forms)
    export_wan_steps(traced, bf16, torch.device("cpu"), (1, 5, 6))
    kinds = [c.kind for c in forms.calls]
    assert len(set(forms.calls)) == len(forms.calls)
    # chunk 0 and steady: 22 3x3x3 convs each (conv_in, conv_out, 20 in residual blocks); 2 1x1x1 shortcuts
    # each, 2 time_convs in steady only (chunk 0 repeats the frame); 3 resamplers each
    assert (kinds.count(CAUSAL_HALO), kinds.count(CAUSAL_POINTWISE), kinds.count(RESAMPLE_HALO)) == (44, 6, 6)
    modules = dict(traced.named_modules(prefix="decoder"))
    like = torch.empty(0, dtype=bf16)
    call = next(c for c in forms.calls if c.module == "decoder.conv_in" and c.cache is not None)
    padding = forms.paddings["decoder.conv_in"]
    assert check_call(call, modules[call.module], padding, ctx.rows, 0, like) == (True, "")
    unpadded = (1, 1, 0, 0, 2, 0)  # a whole conv without its row pad: the band form's rows differ from it
    ok, reason = check_call(call, modules[call.module], unpadded, ctx.rows, 0, like)
    assert not ok and reason.startswith("decoder.conv_in (causal conv on a halo band, input (1, 4, 1, 5, 6))")

    alone = BandContext([(0, 5)], 0)
    alone.run = BandRun(_StandInAlone(), alone.rows)
    steps = []
    for gathered in (False, True):
        forms = ConvForms(alone.id)
        traced, _ = halo_first_decoder(decoder, alone, forms)
        export_wan_steps(traced, bf16, torch.device("cpu"), (1, 7, 6))
        if gathered:
            forms = ConvForms(alone.id, forms.calls)
            traced, _ = halo_first_decoder(decoder, alone, forms)
        chunk0, steady = export_wan_steps(traced, bf16, torch.device("cpu"), (1, 7, 6))
        for graph in (chunk0, steady):
            rewrite_graph(graph, "lossless")
        gathers = sum(n.target is torch.ops.rewrite.band_gather_rows.default for n in steady.graph_module.graph.nodes)
        steps.append((chunk0, steady, gathers))
    try:
        g = torch.Generator().manual_seed(0)
        frames = [torch.randn((1, 4, 1, 7, 6), generator=g).to(bf16) for _ in range(3)]
        for frame in frames:  # the step input's halo rows: zeros at the global edges (`halo_latent`)
            frame[..., 0, :] = frame[..., -1, :] = 0
        outputs = []
        with torch.no_grad():
            for chunk0, steady, _ in steps:
                y, *caches = chunk0(chunk0.weights(decoder), frames[0])
                seen = [y, *caches]
                for frame in frames[1:]:
                    y, *caches = steady(steady.weights(decoder), frame, *caches)
                    seen += [y, *caches]
                outputs.append(seen)
        assert (steps[0][2], steps[1][2]) == (1, 30)  # the attention's gather; then 22 + 4 + 3 convs' too
        assert len(outputs[0]) == len(outputs[1])
        assert all(torch.equal(a, b) for a, b in zip(*outputs))
    finally:
        alone.run = None
