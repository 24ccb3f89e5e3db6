"""Decode driver for an optimized `AutoencoderKLWan`: the frame loop around the captured step graphs.

`WanRunner.install(vae)` sets two instance attributes and nothing else (no parameter, buffer or submodule
changes, so `state_dict()` is untouched):
  * `vae._decode`: post_quant_conv, chunk 0 graph, steady graph per later frame written into a
    preallocated video, unpatchify, clamp. Tiling and slicing stay diffusers' own code paths.
  * `vae.decoder.forward`: serves diffusers' own callers of the decoder (e.g. `tiled_decode`) from the
    same graphs, keeping the feat_cache list protocol; any call it cannot serve goes to the class forward.
`WanRunner.uninstall(vae)` removes both. Every call first runs the guards of `rewrite.runtime.guards`;
when one objects, the call runs diffusers' reference code and the reason is logged and reported.
"""

from __future__ import annotations

import dataclasses
import types

import torch
from torch import nn

from rewrite.capture.export import CapturedGraph
from rewrite.capture.wan import capture_wan_decoder, reference_forward
from rewrite.report import FallbackLog, GraphReport
from rewrite.runtime import guards
from rewrite.runtime.cache_writes import write_caches_in_place
from rewrite.runtime.captures import CaptureCache
from rewrite.runtime.conv_weights import ChannelsLastWeights, channels_last_weight_slots
from rewrite.runtime.graphs import GraphCache, StaticStep, static_buffer_mode


class WanRunner:
    """Captured graphs per (dtype, device) of one Wan VAE and the code that runs them."""

    model_name = "wan"

    def __init__(self, vae: nn.Module, level: str, rewrite_graph) -> None:
        self.level = level
        self.rewrite_graph = rewrite_graph  # fn(CapturedGraph, level) applying the level's passes in place
        self.graphs: CaptureCache[tuple[CapturedGraph, CapturedGraph]] = CaptureCache()  # per (dtype, device)
        self.fallbacks = FallbackLog()
        self.z_dim = vae.config.z_dim
        self.temporal_factor = 2 ** sum(bool(t) for t in vae.decoder.temperal_upsample)
        self.cuda_graphs = GraphCache(max_entries=4)  # per (batch, latent h, w, dtype, device)
        self.use_cuda_graphs = True
        self.channels_last_weights = ChannelsLastWeights()  # shared by the CUDA graphs of every shape
        self._reference_decode = type(vae)._decode.__get__(vae)
        self.vae = vae

    # ---- installation -------------------------------------------------------------------------------
    def install(self, vae: nn.Module) -> None:
        self.vae = vae
        vae._rewrite_runner = self
        vae._decode = types.MethodType(_optimized_decode, vae)
        vae.decoder.forward = types.MethodType(_routed_decoder_forward, vae.decoder)
        vae.decoder._rewrite_runner = self
        self._installed_forward = vae.decoder.__dict__["forward"]

    @staticmethod
    def uninstall(vae: nn.Module) -> None:
        for obj, names in ((vae, ("_decode", "_rewrite_runner")), (vae.decoder, ("forward", "_rewrite_runner"))):
            for name in names:
                obj.__dict__.pop(name, None)

    # ---- capture ------------------------------------------------------------------------------------
    def graphs_for(self, decoder: nn.Module, dtype: torch.dtype, device: torch.device):
        """The (chunk0, steady) graphs for this dtype/device, captured and rewritten on first use."""
        def capture():
            pair = capture_wan_decoder(decoder, dtype, device)
            for graph in pair:
                self.rewrite_graph(graph, self.level)
            return pair

        return self.graphs.get((dtype, device), capture, f"{dtype} on {device}")

    def graph_reports(self) -> list[GraphReport]:
        return [GraphReport.of(g) for pair in self.graphs.values.values() for g in pair]

    def warmup(self, device: torch.device, dtype: torch.dtype, batch: int = 1, shapes=()) -> None:
        """Capture the graphs, and on CUDA the chunk-0/steady CUDA graphs, for latent sizes `shapes`.

        `shapes` lists `(latent_height, latent_width)` pairs; each is served by decoding a two-frame zero
        latent (chunk 0 and one steady step) of that size.
        """
        for height, width in shapes:
            z = torch.zeros(batch, self.z_dim, 2, height, width, device=device, dtype=dtype)
            with torch.no_grad():
                self.vae._decode(z)
            if self.fallbacks.last_path != "graphs":
                raise RuntimeError(f"warmup: the graphs cannot serve {tuple(z.shape)} {dtype} on {device}: "
                                   f"{self.fallbacks.last_reason}")

    # ---- decode-time routing ------------------------------------------------------------------------
    def fallback_reason(self, decoder: nn.Module, x: torch.Tensor) -> str | None:
        """Why this decoder input cannot run through the graphs, or None (captures on first use)."""
        reason = (
            guards.autograd_reason(decoder, x)
            or guards.hook_reason(decoder, "decoder", allowed_forward=self._installed_forward)
            or guards.uniform_parameters_reason(decoder, x)
            or guards.capture_in_progress_reason(x.device)
            or guards.cudnn_reason(x.device)
        )
        if reason is None and self.graphs_for(decoder, x.dtype, x.device) is None:
            reason = self.graphs.errors[(x.dtype, x.device)]
        return reason

    def check_latents(self, z: torch.Tensor) -> None:
        if not isinstance(z, torch.Tensor) or z.dim() != 5 or z.shape[1] != self.z_dim:
            got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            raise ValueError(
                f"Wan latents must be [batch, {self.z_dim}, frames, height, width] (z_dim={self.z_dim}); got {got}"
            )
        if min(z.shape[0], z.shape[2], z.shape[3], z.shape[4]) < 1:
            raise ValueError(f"Wan latents must have at least one batch item, frame, row and column; got {tuple(z.shape)}")

    def decode_frames(self, decoder: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """All latent frames of `x` (after post_quant_conv) through the graphs, into one preallocated video.

        On CUDA the steps replay CUDA graphs per (batch, h, w, dtype); elsewhere, or once a capture has
        failed, the graph modules run eagerly with the caches passed from step to step.
        """
        chunk0, steady = self.graphs_for(decoder, x.dtype, x.device)
        weights0, weights = chunk0.weights(decoder), steady.weights(decoder)
        steps = None
        if x.is_cuda and self.use_cuda_graphs:
            b, _, _, h, w = x.shape
            try:
                steps = self.cuda_graphs.get((b, h, w, x.dtype, x.device), weights0 + weights,
                                             lambda: _WanCudaGraphs(chunk0, steady, weights0, weights, x[:, :, 0:1],
                                                                    self.channels_last_weights))
            except Exception as error:  # a failed capture must not fail the decode: eager graphs from now on
                self.use_cuda_graphs = False
                self.cuda_graphs.clear()
                self.fallbacks.note(f"CUDA graph capture failed, running the graphs eagerly: {type(error).__name__}: {error}")
        if steps is None:
            steps = _WanEagerSteps(chunk0, steady, weights0, weights)
        frames = x.shape[2]
        y = steps.first(x[:, :, 0:1])
        video = y.new_empty((y.shape[0], y.shape[1], 1 + (frames - 1) * self.temporal_factor, *y.shape[3:]))
        video[:, :, 0:1] = y
        for i in range(1, frames):
            y = steps.next(x[:, :, i : i + 1])
            start = 1 + (i - 1) * self.temporal_factor
            video[:, :, start : start + y.shape[2]] = y
        return video


class _WanEagerSteps:
    """The chunk-0 and steady graph modules run eagerly, the caches handed from one step to the next."""

    def __init__(self, chunk0, steady, weights0, weights):
        self.chunk0, self.steady, self.weights0, self.weights = chunk0, steady, weights0, weights
        self.caches: list[torch.Tensor] = []

    def first(self, x: torch.Tensor) -> torch.Tensor:
        y, *self.caches = self.chunk0(self.weights0, x)
        return y

    def next(self, x: torch.Tensor) -> torch.Tensor:
        y, *self.caches = self.steady(self.weights, x, *self.caches)
        return y


class _WanCudaGraphs:
    """The chunk-0 and steady graphs of one shape, over a static latent buffer and static caches.

    Each captured step copies its new caches into the static cache buffers (after every read of the old
    ones: a T=1 stage's new cache holds its old last frame), so consecutive replays advance the decode exactly
    as the uncaptured loop does. The steady graph does it inside, each cache as soon as the old one is dead
    (`rewrite.runtime.cache_writes`: the new caches are not all alive at once, which set the peak memory);
    chunk 0 copies at its end. Both graphs share one memory pool (they never overlap).

    The conv weights that channels-last ops read are passed as channels-last copies from `layout_store`
    (`rewrite.runtime.conv_weights`), refreshed from the live weights at the start of chunk 0, i.e. once per
    decode instead of once per op call in every step.
    """

    def __init__(self, chunk0, steady, weights0, weights, x_example: torch.Tensor,
                 layout_store: ChannelsLastWeights):
        weights0, pairs0 = layout_store.substitute(channels_last_weight_slots(chunk0.graph_module), weights0)
        weights, pairs = layout_store.substitute(channels_last_weight_slots(steady.graph_module), weights)
        refresh_pairs = layout_store.distinct(pairs0 + pairs)
        with static_buffer_mode():
            self.x = torch.zeros(x_example.shape, dtype=x_example.dtype, device=x_example.device)
            _, *caches = chunk0(weights0, self.x)  # eager: cache shapes, and the first warm-up
            self.caches = [c.clone() for c in caches]
            del _, caches  # not kept alive through the captures below (they would count twice in the peak)

        def first(x):
            layout_store.refresh(refresh_pairs)
            y, *new = chunk0(weights0, x)
            for static, value in zip(self.caches, new):
                static.copy_(value)
            return [y]

        module, late = write_caches_in_place(steady.graph_module, steady.user_input_names)
        steady_in_place = dataclasses.replace(steady, graph_module=module)

        def following(x, *caches):
            y, *new = steady_in_place(weights, x, *caches)  # writes the other caches itself
            for index, value in zip(late, new):
                caches[index].copy_(value)
            return [y]

        pool = torch.cuda.graph_pool_handle()
        self._first = StaticStep(first, [self.x], pool=pool)
        self._next = StaticStep(following, [self.x, *self.caches], pool=pool)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x)
        return self._first.replay()[0]

    def next(self, x: torch.Tensor) -> torch.Tensor:
        self.x.copy_(x)
        return self._next.replay()[0]


def _optimized_decode(vae: nn.Module, z: torch.Tensor, return_dict: bool = True):
    """Replacement for `AutoencoderKLWan._decode` (bound to the instance by `WanRunner.install`)."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify
    from diffusers.models.autoencoders.vae import DecoderOutput

    runner: WanRunner = vae._rewrite_runner
    runner.check_latents(z)
    _, _, _, height, width = z.shape
    if vae.use_tiling and (
        width > vae.tile_sample_min_width // vae.spatial_compression_ratio
        or height > vae.tile_sample_min_height // vae.spatial_compression_ratio
    ):
        return vae.tiled_decode(z, return_dict=return_dict)  # its decoder calls come back through the graphs

    reason = guards.autograd_reason(vae, z)
    x = None
    if reason is None:
        x = vae.post_quant_conv(z)
        reason = runner.fallback_reason(vae.decoder, x)
    if reason is not None:
        runner.fallbacks.took_reference(reason)
        return runner._reference_decode(z, return_dict=return_dict)

    video = runner.decode_frames(vae.decoder, x)
    runner.fallbacks.took_graphs()
    if vae.config.patch_size is not None:
        video = unpatchify(video, patch_size=vae.config.patch_size)
    video.clamp_(min=-1.0, max=1.0)
    vae.clear_cache()  # the reference leaves an empty cache behind; keep that observable state the same
    return DecoderOutput(sample=video) if return_dict else (video,)


def _routed_decoder_forward(decoder: nn.Module, x, feat_cache=None, feat_idx=[0], first_chunk=False):  # noqa: B006
    """Instance forward of the decoder: one chunk through the graphs, keeping diffusers' cache protocol.

    Serves calls with a feat_cache list whose slots are all empty (chunk 0) or all steady-form tensors
    (2 frames each); anything else (uncached calls, a cache the reference filled) runs the class forward.
    """
    runner: WanRunner = decoder._rewrite_runner
    if feat_cache is None:
        return reference_forward(decoder, x, feat_cache, feat_idx, first_chunk)
    reason = runner.fallback_reason(decoder, x)
    graphs = None if reason else runner.graphs[(x.dtype, x.device)]
    if graphs is not None:
        chunk0, steady = graphs
        slots = sum(kind == "user" for kind, _ in steady.input_kinds) - 1  # the user inputs are x and the caches
        current = feat_cache[:slots]
        if first_chunk or all(slot is None for slot in current):
            y, *caches = chunk0(chunk0.weights(decoder), x)
        elif all(isinstance(slot, torch.Tensor) and slot.shape[2] == 2 for slot in current):
            y, *caches = steady(steady.weights(decoder), x, *current)
        else:
            graphs = None
            reason = "decoder cache is in the reference's chunk-1 form"
    if graphs is None:
        runner.fallbacks.took_reference(reason)
        return reference_forward(decoder, x, feat_cache, feat_idx, first_chunk)
    feat_cache[:slots] = caches
    feat_idx[0] += slots
    runner.fallbacks.took_graphs()
    return y

