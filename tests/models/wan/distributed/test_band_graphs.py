"""`rewrite.models.wan.distributed.band_graphs`, in process: the halo-first decoder, the band graph store's
recaptures and the band norms' summation order."""

from __future__ import annotations

import torch


def test_halo_first_decoder_and_halo_latent():
    """The exported band form: the 3x3x3 causal convs pad no rows (their halo rows are their row pad), the
    norms feeding them and the resamplers' upsamples read through the halo op, the attention gathers; the
    live decoder is untouched; a conv without that form is named. The halo latent has the neighbours' rows
    and zero rows at the global edges."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    from rewrite.models.wan.distributed.band_convs import ConvForms
    from rewrite.models.wan.distributed.band_graphs import halo_first_decoder, halo_latent
    from rewrite.models.wan.distributed.band_ops import BandContext
    from rewrite.models.wan.distributed.bands import BandRun
    from rewrite.models.wan.config import build_wan

    decoder = build_wan("wan2.1", "tiny").decoder
    ctx = BandContext([(0, 3), (3, 5)], 1)
    forms = ConvForms(ctx.id)
    copy, reason = halo_first_decoder(decoder, ctx, forms)
    assert reason is None
    assert copy.conv_in._padding == (1, 1, 0, 0, 2, 0) and decoder.conv_in._padding == (1, 1, 1, 1, 2, 0)
    assert forms.paddings["decoder.conv_in"] == (1, 1, 1, 1, 2, 0)
    assert copy.mid_block.resnets[0].norm1.forward.args == (copy.mid_block.resnets[0].norm1, ctx.id)
    assert "forward" in copy.up_blocks[0].upsamplers[0].resample.__dict__
    assert "forward" in copy.mid_block.attentions[0].__dict__
    assert not any("forward" in m.__dict__ for m in decoder.modules())
    decoder.conv_out = WanCausalConv3d(decoder.conv_out.in_channels, 3, 5, padding=2)
    reason = "decoder.conv_out: a causal conv with kernel (5, 5, 5) there has no halo-first form"
    assert halo_first_decoder(decoder, ctx, ConvForms(ctx.id)) == (None, reason)

    class Comm:  # the geometry only: halo_latent exchanges nothing
        rank, world, name, _global = 1, 2, "test", (0, 1)

    x = torch.arange(5.0).view(1, 1, 1, 5, 1).expand(1, 2, 3, 5, 2).contiguous()
    run = BandRun(Comm(), [(0, 3), (3, 5)])
    ext = halo_latent(x, run)
    assert ext[0, 0, 0, :, 0].tolist() == [2.0, 3.0, 4.0, 0.0] and ext.is_contiguous()
    run.rank = 0
    assert halo_latent(x, run)[0, 1, 2, :, 1].tolist() == [0.0, 0.0, 1.0, 2.0, 3.0]


def test_band_graph_store_captures_again_a_bounded_number_of_times():
    """A band pair is captured again when the module tree changed, at most `MAX_RECAPTURES` times per key;
    then its key keeps the reason and the eager band mode serves (the graphs are not rewritten here: a
    runner whose passes do nothing)."""
    from torch import nn

    from rewrite.models.wan.distributed.band_graphs import BandGraphStore
    from rewrite.models.wan.config import build_wan
    from rewrite.runtime.runner import MAX_RECAPTURES

    class Passless:
        def rewrite_graph(self, graph, level):
            pass

    bf16 = torch.bfloat16
    decoder = build_wan("wan2.1", "tiny").decoder.to(bf16)
    store, key, seen = BandGraphStore(), ("a key",), []
    for i in range(MAX_RECAPTURES + 2):
        graphs, reason = store.pair(Passless(), decoder, key, [(0, 3), (3, 5)], 0, (1, 5, 6), bf16,
                                    torch.device("cpu"))
        again, _ = store.pair(Passless(), decoder, key, [(0, 3), (3, 5)], 0, (1, 5, 6), bf16, torch.device("cpu"))
        seen.append((graphs is not None, again is graphs, reason))
        if i % 2:  # a module added, then removed again: each a change of the tree
            del decoder.extra
        else:
            decoder.extra = nn.Identity()
    assert seen[:-1] == [(True, True, None)] * (MAX_RECAPTURES + 1)
    last, why = seen[-1], seen[-1][2] or ""
    assert last[:2] == (False, True), seen
    assert why.startswith("the decoder changed after 3 recaptures of the band graphs of rank 0 at latent size "
                          "(1, 5, 6) (decoder children: ") and why.endswith(
                              "decoder.extra removed); the eager band mode serves it from now on"), why


def test_band_norms_take_the_whole_tensors_order(monkeypatch):
    """A band's norm sums in ATen's order for the whole tensor: the band graphs give each norm of a halo band
    the whole tensor's rows (`norm_rows`), and the plan for those rows is the whole tensor's, which differs
    from the band's own for Wan 2.2's 1024-channel norm at 720p on 2 ranks (10 blocks per output against 16;
    H200: 132 SMs, 2048 threads each)."""
    from rewrite.models.wan.distributed.band_convs import ConvForms
    from rewrite.models.wan.distributed.band_graphs import halo_first_decoder, whole_norm_orders
    from rewrite.models.wan.distributed.band_ops import BandContext
    from rewrite.models.wan.capture import export_wan_steps
    from rewrite.models.wan.config import build_wan
    from rewrite.kernels.norm import aten_reduction
    from rewrite.pipeline import rewrite_graph

    monkeypatch.setattr(aten_reduction, "_device_limits", lambda index: (132, 2048))
    whole, band = (1, 1024, 2, 90, 160), (1, 1024, 2, 48, 160)  # band: 23 latent rows x 2, plus 2 halo rows
    strides = aten_reduction.dense_strides_in_order(whole, (5, 4, 3, 2, 1))
    assert strides == (29491200, 28800, 14400, 160, 1)
    assert aten_reduction.plan_of(whole, strides, 0, 4, 0).ctas == 10
    assert aten_reduction.plan_of(band, aten_reduction.dense_strides_in_order(band, strides), 0, 4, 0).ctas == 16

    decoder = build_wan("wan2.1", "tiny").decoder.to(torch.bfloat16)
    ctx = BandContext([(0, 3), (3, 5)], 0)
    traced, _ = halo_first_decoder(decoder, ctx, ConvForms(ctx.id))
    chunk0, _ = export_wan_steps(traced, torch.bfloat16, torch.device("cpu"), (1, 5, 6))
    rewrite_graph(chunk0, "lossless")
    assert whole_norm_orders(chunk0.graph_module, ctx) == 21  # every norm + SiLU that feeds a conv
    rows = sorted({n.kwargs["norm_rows"] for n in chunk0.graph_module.graph.nodes if "norm_rows" in n.kwargs})
    assert rows == [5, 10, 20, 40]  # the whole latent's 5 rows at each resolution
