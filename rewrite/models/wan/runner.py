"""Decode driver for an optimized `AutoencoderKLWan`: the frame loop around the captured step graphs.

`WanRunner.install(vae)` sets six instance attributes and nothing else (no parameter, buffer or submodule
changes, so `state_dict()` is untouched):
  * `vae._decode`: post_quant_conv, chunk 0 graph, steady graph per later frame written into a
    preallocated video, unpatchify, clamp. Tiling and slicing stay diffusers' own code paths.
  * `vae.decoder.forward`: serves diffusers' own callers of the decoder (e.g. `tiled_decode`) from the
    same graphs, keeping the feat_cache list protocol; any call it cannot serve goes to the class forward.
  * `vae.decode_stream`: the same decode yielding each latent frame's frames as they are decoded
    (`rewrite.models.wan.stream`, which also holds `rewrite.stream` sessions);
  * `vae._encode`: the encoder's step graphs over its caches, then quant_conv (`rewrite.models.wan.encode`);
  * `vae._rewrite_runner` and `vae.decoder._rewrite_runner`: this runner.
`WanRunner.uninstall(vae)` removes them. Every call first runs the guards of `rewrite.runtime.guards`;
when one objects, the call runs diffusers' reference code and the reason is logged and reported. Calls
of one module run one at a time, stream-ordered (`DecoderRunner.lock`); a decoder changed since its capture
is captured again (`DecoderRunner.captured`).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from torch import nn

from rewrite.capture.export import WeightLocations
from rewrite.models.wan.capture import capture_wan_decoder, reference_forward
from rewrite.ops import compile_ahead
from rewrite.reporting import GraphReport, WarmupResult
from rewrite.runtime import disk_cache, guards
from rewrite.models.wan.conv_weights import ChannelsLastWeights
from rewrite.models.wan.steps import ONE_FRAME, CudaGraphSteps, EagerSteps, chunk0_output_only, steady_in_place
from rewrite.models.wan.warmup_sizes import frame_counts, latent_sizes
from rewrite.runtime.graph_memory import GraphMemory, budget_option
from rewrite.runtime.graphs import CudaGraphBackend, describe_key
from rewrite.runtime.locks import CAPTURE_GATE
from rewrite.runtime.runner import EVERY_LEVEL, OUT_OF_MEMORY_REASON, DecoderRunner, installed_runner
from rewrite.models.wan.frames import (
    CHUNK1_FORM, decodes_tiled, finish_video, run_graph_chunk, store_frames, temporal_factor)

logger = logging.getLogger("rewrite")


class WanRunner(DecoderRunner):
    """Captured graphs of one Wan VAE and the code that runs them.

    Graph keys (`graph_key`): the first `STATIC_SIZES` latent sizes decoded in a dtype and device get graphs
    exported for that size alone, ``(dtype, device, (batch, height, width))``, which export in about a third of
    the time of symbolic ones (the largest part of a first call); the next size gets graphs with the batch and
    sizes symbolic, ``(dtype, device, None)``, which then serve every size without graphs of its own. Same
    ops, same kernels: only the export's shape arithmetic differs.
    """

    #: latent sizes per dtype and device that get graphs of their own before the symbolic ones serve the rest
    STATIC_SIZES = 4

    model_name = "wan"
    #: `rewrite.models.wan.stream` serves this runner's modules (read there without importing this module)
    decodes_streams = True

    OPTIONS = {"cache_dir": EVERY_LEVEL, "graph_memory_budget": EVERY_LEVEL}

    def __init__(self, vae: nn.Module, level: str, rewrite_graph, *, cache_dir=None,
                 graph_memory_budget=None) -> None:
        super().__init__(level, rewrite_graph, {"cache_dir": disk_cache.cache_dir_option(cache_dir),
                                                "graph_memory_budget": graph_memory_budget})
        self.z_dim = vae.config.z_dim
        self.temporal_factor = temporal_factor(vae.decoder)
        # per (batch, latent h, w, dtype, device), one pool and cache block per device; builds go to the report
        self.cuda_graphs = GraphMemory(CudaGraphBackend(), budget_option(graph_memory_budget),
                                       on_build=self.cuda_graphs_built)
        self._compiled_ahead: set[tuple] = set()  # CUDA-graph keys whose Triton kernels were compiled ahead
        self.use_cuda_graphs = True
        self.channels_last_weights = ChannelsLastWeights()  # shared by the CUDA graphs of every shape
        self._accepted: dict[tuple, guards.AcceptedState] = {}  # per (dtype, device): see `region_reason`
        self.vae = vae

    @property
    def graph_backend(self):
        """What captures the steps' CUDA graphs (`CudaGraphBackend`; tests and profiles: an eager stand-in)."""
        return self.cuda_graphs.backend

    @graph_backend.setter
    def graph_backend(self, backend) -> None:
        self.cuda_graphs.clear()
        self.cuda_graphs.backend = backend

    # ---- installation -------------------------------------------------------------------------------
    @classmethod
    def entry_points(cls, vae: nn.Module):
        from rewrite.models.wan.encode import optimized_encode  # built on this module
        from rewrite.models.wan.stream import decode_stream

        return [(vae, "_decode", _optimized_decode), (vae, "decode_stream", decode_stream),
                (vae.decoder, "forward", _routed_decoder_forward), (vae, "_encode", optimized_encode)]

    def install(self, vae: nn.Module) -> None:
        self.vae = vae
        super().install(vae)
        self._installed_forward = vae.decoder.__dict__["forward"]

    def _reference_decode(self, z: torch.Tensor, return_dict: bool = True):
        """diffusers' own `_decode` (its decoder calls reach the class forward directly, counted once)."""
        with self.serving_reference():
            return type(self.vae)._decode(self.vae, z, return_dict=return_dict)

    def reference_encode(self, x: torch.Tensor) -> torch.Tensor:
        """diffusers' own `_encode`."""
        with self.serving_reference():
            return type(self.vae)._encode(self.vae, x)

    # ---- capture ------------------------------------------------------------------------------------
    def graph_key(self, x: torch.Tensor, *, symbolic: bool = False) -> tuple:
        """The key of the graphs that serve decoder input `x` (class docstring): its size's own where those
        exist (or failed), else the symbolic ones where those exist, else the size's own while its dtype and
        device have fewer than `STATIC_SIZES`, else the symbolic ones. `symbolic`: the symbolic key regardless."""
        static, shared = (x.dtype, x.device, (x.shape[0], x.shape[3], x.shape[4])), (x.dtype, x.device, None)
        if symbolic:
            return shared
        for key in (static, shared):
            if key in self.graphs.values or key in self.graphs.errors:
                return key
        sizes = sum(key[:2] == static[:2] and key[2] is not None for key in {*self.graphs.values, *self.graphs.errors})
        return static if sizes < self.STATIC_SIZES else shared

    def graphs_for(self, decoder: nn.Module, key: tuple, listing=None):
        """The (chunk0, steady) graphs of `key` (`graph_key`), captured and rewritten on first use and again
        after the decoder changed (`DecoderRunner.captured`); None when the capture failed."""
        dtype, device, size = key

        def capture():  # exported and rewritten, or read back from the disk cache
            return self.capture_graphs(lambda: capture_wan_decoder(decoder, dtype, device, size), key=key,
                                       model=self.vae, root=decoder, names=("chunk0", "steady"), dtype=dtype,
                                       device=device, size=size)

        listing = list(decoder.named_modules(prefix="decoder")) if listing is None else listing
        what = f"{dtype} on {device}" + ("" if size is None else f" at latent size {describe_key(size)}")
        return self.captured(key, listing, capture, what)

    def forget_graphs(self, key) -> None:
        self.cuda_graphs.clear()
        self._accepted.pop(key, None)

    def graph_reports(self) -> list[GraphReport]:
        return [dataclasses.replace(GraphReport.of(g), sizes="any" if key[2] is None else describe_key(key[2]))
                for key, pair in self.graphs.values.items() for g in pair]

    def cuda_graph_counts(self) -> dict[str, int]:
        return {"CUDA graph shapes": len(self.cuda_graphs)} if self.cuda_graphs.captures else {}

    def graph_memory(self):
        return self.cuda_graphs.report() if self.cuda_graphs.captures or self.cuda_graphs.over_budget else None

    @torch.no_grad()  # captures for no-grad decodes, whatever the caller's grad mode
    def warmup(self, device: torch.device, dtype: torch.dtype, batch: int = 1, shapes=None,
               frames=None, encode_shapes=None, encode_frames=None) -> WarmupResult:
        """Capture what the first decodes of these sizes would: the step graphs for `dtype`/`device` and, on CUDA,
        the chunk-0/steady CUDA graphs of each latent size in `shapes`, a list of `(latent_height, latent_width)`
        pairs, by decoding a two-frame zero latent of that size (chunk 0 and one steady step). On CUDA, before a
        size's first capture, its Triton kernels are compiled in parallel (`rewrite.ops.compile_ahead`).
        Without `shapes` only the step graphs are captured (the result says so).

        The sizes are captured largest first (they share one pool and cache block, `rewrite.runtime.graph_memory`).
        `frames`: the latent frame count(s) later decodes of those sizes will have (an int or a list). The step
        graphs do not depend on it; the CUDA graphs do only in that single-frame decodes get chunk 0's alone
        (`cuda_steps`): frames=1 captures those (a one-frame zero latent) instead of the two-frame decode (whose
        steps serve single frames too). On CUDA the output video of the largest count is allocated once and
        given back to the caching allocator, so a later decode finds that memory reserved.

        `encode_shapes`, `encode_frames`: the same for `vae.encode` (`rewrite.models.wan.encode.warmup_encode`),
        in video pixels and frames; given alone, only the encoder is warmed up. Returns the shapes (an encoder's
        end in "encode"), seconds and the breakdown of what the captures cost."""
        pairs = latent_sizes(shapes)
        counts = frame_counts(frames)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"warmup: batch must be a positive int, got {batch!r}")
        if counts and not pairs:
            raise ValueError("warmup: frames= needs shapes=[(latent_height, latent_width), ...]: the CUDA graphs and "
                             "the output video are per latent size")
        start, mark = time.perf_counter(), len(self.timings)
        encoded = []
        if encode_shapes is not None or encode_frames is not None:
            from rewrite.models.wan.encode import warmup_encode

            encoded = warmup_encode(self, device, dtype, batch, encode_shapes, encode_frames)
            if shapes is None:
                return WarmupResult(encoded, time.perf_counter() - start, breakdown=self.timings.records(mark))
        if not pairs:
            x = torch.zeros(batch, self.z_dim, 1, 1, 1, device=device, dtype=dtype)
            with self.lock.holding(device), CAPTURE_GATE.running():
                reason = self.region_reason(self.vae.decoder, x, symbolic=True)
            if reason is not None:
                raise RuntimeError(f"warmup: the graphs cannot serve {dtype} on {device}: {reason}")
            note = ("no shapes given: the step graphs with symbolic sizes are captured (they serve every size); "
                    "the CUDA graphs of a latent size are captured by its first decode (pass shapes=[(latent_height, "
                    "latent_width), ...]: the first size then also gets step graphs of its own, quicker to export)")
            logger.info("warmup: %s", note)
            return WarmupResult([], time.perf_counter() - start, note, breakdown=self.timings.records(mark))
        # largest first: later sizes are captured into the memory of the first (`rewrite.runtime.graph_memory`)
        latent_frames = 1 if counts and max(counts) == 1 else 2  # 2: chunk 0 and one steady step
        for height, width in sorted(pairs, key=lambda pair: -pair[0] * pair[1]):  # kernels compiled ahead in the decode
            z = torch.zeros(batch, self.z_dim, latent_frames, height, width, device=device, dtype=dtype)
            sample = self.vae._decode(z).sample
            if self.fallbacks.last_path != "graphs":
                raise RuntimeError(f"warmup: the graphs cannot serve {tuple(z.shape)} {dtype} on {device}: "
                                   f"{self.fallbacks.last_reason}")
            if counts and device.type == "cuda":
                self._reserve_video(sample, max(counts))
        return WarmupResult(encoded + [(batch, h, w) for h, w in pairs], time.perf_counter() - start,
                            breakdown=self.timings.records(mark))

    def _compile_kernels_ahead(self, batch: int, height: int, width: int, dtype: torch.dtype,
                               device: torch.device, *, with_steady: bool = True) -> None:
        """Before the first CUDA-graph capture of a size (`cuda_steps`): one chunk-0 and one steady step of the graphs in which
        every Triton launch only submits its compile to a thread pool (`rewrite.ops.compile_ahead`), so the
        kernels compile in parallel instead of one by one in the capture's warm-up. Nothing is computed (the
        outputs are dropped), nothing is changed: a variant it missed is compiled by the warm-up as before.
        `with_steady=False`: chunk 0 alone (graphs for single-frame decodes)."""
        key = (batch, height, width, dtype, device) + (ONE_FRAME,) * (not with_steady)
        if (device.type != "cuda" or not compile_ahead.available() or key in self._compiled_ahead
                or key in self.cuda_graphs or key[:5] in self._compiled_ahead):
            return
        x = torch.zeros(batch, self.z_dim, 1, height, width, device=device, dtype=dtype)
        decoder = self.vae.decoder
        with self.lock.holding(device), CAPTURE_GATE.running():
            if self.region_reason(decoder, x) is not None:
                return  # the decode that follows says why
            self._compiled_ahead.add(key)
            chunk0, steady = self.graphs[self.graph_key(x)]
            start = time.perf_counter()
            try:
                with compile_ahead.compile_ahead() as active:
                    if active and with_steady:  # the steady step as captured: its new caches not all alive at once
                        _, *caches = chunk0(chunk0.weights(decoder), x)
                        del _
                        steady_in_place(steady)[0](steady.weights(decoder), x, *caches)
                    elif active:  # chunk 0 as a single frame's graph runs it: without its caches
                        output_only = chunk0_output_only(chunk0)
                        output_only(output_only.weights(decoder), x)
            except Exception as error:  # noqa: BLE001 - only a speed-up: the capture compiles what is missing
                logger.warning("compiling the Triton kernels ahead failed (%s: %s); they compile during the "
                               "capture", type(error).__name__, error)
            self.timings.add("CUDA graphs " + describe_key(key), "compile ahead", time.perf_counter() - start)

    def release_device_memory(self) -> None:
        """The CUDA graphs of every size (their pools and static latent and cache buffers) and the channels-last
        weight copies go; the FX graphs stay."""
        self.cuda_graphs.clear()
        self.channels_last_weights = ChannelsLastWeights()

    def _reserve_video(self, sample: torch.Tensor, frames: int) -> None:
        """Allocate and free the output of a `frames`-latent-frame decode of `sample`'s size (the video and, with
        a patch size, its unpatchified copy, alive together), so the caching allocator holds those blocks."""
        per_frame = sample.numel() // sample.shape[2]
        count = 2 if getattr(self.vae.config, "patch_size", None) is not None else 1  # Qwen-Image: no patch_size
        blocks = [torch.empty(per_frame * (1 + (frames - 1) * self.temporal_factor), dtype=sample.dtype,
                              device=sample.device) for _ in range(count)]
        del blocks

    # ---- decode-time routing ------------------------------------------------------------------------
    def decode_reason(self, vae: nn.Module, z: torch.Tensor) -> str | None:
        """Why `vae._decode(z)` cannot run through the graphs, or None. Checked on the latents, before
        ``post_quant_conv`` runs (it runs once, on whichever path serves the call)."""
        reason = (guards.autograd_reason(vae, z) or guards.autocast_reason(z.device)
                  or self.region_reason(vae.decoder, z))
        if reason is None:
            reason = guards.uniform_parameters_reason(vae.post_quant_conv, z)
        return reason

    def region_reason(self, decoder: nn.Module, x: torch.Tensor, *, symbolic: bool = False) -> str | None:
        """Why decoder input `x` cannot run through the graphs of `graph_key(x)`, or None (captures on first
        use; `symbolic`: the symbolic graphs). A call whose full checks passed leaves a `guards.AcceptedState`:
        the next call of that key only re-checks cheaply that nothing those checks look at has changed."""
        key = self.graph_key(x, symbolic=symbolic)
        return self.checked_region(decoder, "decoder", x, key, self.graphs_for, self._installed_forward)

    def checked_region(self, region: nn.Module, name: str, x: torch.Tensor, key: tuple, graphs_for,
                       allowed_forward=None) -> str | None:
        """Why input `x` of `region` (the decoder, or the encoder: `name`) cannot run through the graphs of
        `key`, which ``graphs_for(region, key, listing)`` captures on first use, or None (`region_reason`)."""
        accepted = self._accepted.get(key)
        if accepted is not None and accepted.holds(region) and self._call_reason(region, x) is None:
            return None
        self._accepted.pop(key, None)
        listing = list(region.named_modules(prefix=name))
        reason = (
            guards.hook_reason(region, name, allowed_forward=allowed_forward, modules=listing)
            or guards.training_reason(listing)
            or guards.tensor_attribute_reason(listing)
            or guards.uniform_parameters_reason(region, x, name)
            or self._call_reason(region, x)
        )
        if reason is not None:
            return reason
        graphs = graphs_for(region, key, listing)
        if graphs is None:
            return self.graphs.errors[key]
        try:
            for graph in graphs:
                graph.weights(region)
        except AttributeError as error:  # e.g. a parametrization, or a parameter replaced by a plain tensor
            return f"a graph weight is no longer a parameter or buffer of that name: {error}"
        locations = [graph.weight_locations(region) for graph in graphs]
        if all(part is not None for part in locations):
            self._accepted[key] = guards.AcceptedState(region, listing, WeightLocations.joined(locations))
        return None

    @staticmethod
    def _call_reason(decoder: nn.Module, x: torch.Tensor) -> str | None:
        """The checks of the call's own context (grad mode, autocast, a capture in progress, cuDNN switched off)."""
        return (guards.autograd_reason(decoder, x) or guards.autocast_reason(x.device)
                or guards.capture_in_progress_reason(x.device) or guards.cudnn_reason(x.device))

    def check_latents(self, z: torch.Tensor) -> None:
        """A ValueError for latents diffusers' decode cannot take: not [batch, z_dim, frames, height, width],
        empty, or of another dtype than the VAE's (`guards.refused_input_dtype`)."""
        if not isinstance(z, torch.Tensor) or z.dim() != 5 or z.shape[1] != self.z_dim:
            got = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
            raise ValueError(
                f"Wan latents must be [batch, {self.z_dim}, frames, height, width] (z_dim={self.z_dim}); got {got}"
            )
        if min(z.shape[0], z.shape[2], z.shape[3], z.shape[4]) < 1:
            raise ValueError(f"Wan latents must have at least one batch item, frame, row and column; got {tuple(z.shape)}")
        # diffusers' decode raises for latents of another dtype than post_quant_conv's weights (its first op):
        # a clear error here, before any guard logs a fallback (where a hook or autocast may cast them, the
        # guards send the call to diffusers' code instead)
        expected = guards.refused_input_dtype(self.vae.post_quant_conv, z)
        if expected is not None:
            raise ValueError(f"Wan latents must be {expected}, the dtype of the VAE's weights (diffusers' decode feeds "
                             f"them to post_quant_conv, which takes no other); got {z.dtype} (cast them: "
                             f"z.to({expected}))")

    def decode_frames(self, decoder: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """All latent frames of `x` (after post_quant_conv) through the graphs, into one preallocated video.

        On CUDA the steps replay CUDA graphs per (batch, h, w, dtype); elsewhere, or once a capture has
        failed, the graph modules run eagerly with the caches passed from step to step. The caller holds
        `lock` (the CUDA graphs' static buffers are this module's).
        """
        steps = self.cuda_steps(decoder, x, one_frame=x.shape[2] == 1)
        if steps is None:
            chunk0, steady = self.graphs[self.graph_key(x)]
            steps = EagerSteps(chunk0, steady, chunk0.weights(decoder), steady.weights(decoder))
        frames = x.shape[2]
        video = store_frames(None, steps.first(x[:, :, 0:1]), 0, frames, self.temporal_factor)
        for i in range(1, frames):
            store_frames(video, steps.next(x[:, :, i : i + 1]), i, frames, self.temporal_factor)
        return video

    def cuda_steps(self, decoder: nn.Module, x: torch.Tensor, *, one_frame: bool = False) -> CudaGraphSteps | None:
        """The CUDA-graph steps of `x`'s (batch, h, w, dtype, device), shared by every call of that shape and
        captured on first use; None where the graphs run eagerly (not CUDA, or a capture failed before).
        `one_frame`: the call decodes a single latent frame (an image), so chunk 0 alone serves it: the size's full
        steps where they are held, else steps of chunk 0 alone (`CudaGraphSteps`, `steady=None`), which hold
        neither the steady step's working set nor static caches. The caller holds `lock`; a step's static
        caches hold one clip at a time (`CudaGraphSteps.hold`)."""
        if not (self.use_cuda_graphs and self.graph_backend.can_capture(x.device)):
            return None
        b, _, _, h, w = x.shape
        key = (b, h, w, x.dtype, x.device)
        self._compile_kernels_ahead(b, h, w, x.dtype, x.device,  # a first decode of a size: compiles in parallel
                                    with_steady=not (one_frame and key not in self.cuda_graphs))
        return self.held_steps(key, self.graphs[self.graph_key(x)], decoder, x, b * h * w * x.element_size(),
                               one_frame=one_frame)

    def held_steps(self, key: tuple, graphs, root: nn.Module, x: torch.Tensor, rank: int, *, one_frame: bool,
                   step_frames: int | None = None) -> CudaGraphSteps | None:
        """The `CudaGraphSteps` of `key` in the module's `GraphMemory`, captured on first use from the (chunk0,
        steady) `graphs` reading `root`'s weights, with `x`'s first frame as chunk 0's example input and, where
        the steady step takes `step_frames` frames (the encoder's 4), the next ones as its own; `rank` orders the
        sizes (`GraphMemory.get`). `one_frame`: chunk 0 alone serves the call, so unless `key`'s full steps are
        held, steps of chunk 0 alone are captured under ``key + (ONE_FRAME,)``. None once a capture has failed:
        the graphs run eagerly from then on, with the reason noted. The caller holds `lock`."""
        chunk0, steady = graphs
        one_frame = one_frame and key not in self.cuda_graphs
        weights0 = chunk0.weights(root)
        weights = [] if one_frame else steady.weights(root)
        next_example = None if one_frame or step_frames is None else x[:, :, 1: 1 + step_frames]
        try:
            return self.cuda_graphs.get(
                key + (ONE_FRAME,) * one_frame, x.device, rank, weights0 + weights,
                lambda pool, arena: CudaGraphSteps(chunk0, None if one_frame else steady, weights0, weights,
                                                   x[:, :, 0:1], self.channels_last_weights, self.graph_backend,
                                                   pool, arena, next_example=next_example))
        except torch.OutOfMemoryError:
            raise  # not a failed capture: the call frees memory and tries again (`within_memory`)
        except Exception as error:  # a failed capture must not fail the call: eager graphs from now on
            self.use_cuda_graphs = False
            self.cuda_graphs.clear()
            self.fallbacks.note(f"CUDA graph capture failed, running the graphs eagerly: {type(error).__name__}: {error}")
            return None


@torch.compiler.disable  # torch.compile on top runs this as it is: the graphs are already compiled
def _optimized_decode(vae: nn.Module, z: torch.Tensor, return_dict: bool = True):
    """Replacement for `AutoencoderKLWan._decode` (bound to the instance by `WanRunner.install`)."""
    from diffusers.models.autoencoders.vae import DecoderOutput

    runner: WanRunner = installed_runner(vae)
    runner.check_latents(z)
    if decodes_tiled(vae, z.shape[3], z.shape[4]):  # its decoder calls come back through the graphs
        tiled = runner.within_memory(lambda: vae.tiled_decode(z, return_dict=return_dict))
        if tiled is None:
            runner.fallbacks.took_reference(OUT_OF_MEMORY_REASON)
            return runner._reference_decode(z, return_dict=return_dict)
        return tiled

    def serve() -> tuple[torch.Tensor | None, str | None]:
        """(video, None) through the graphs, or (None, why not); the guards may capture graphs, so they run
        inside `within_memory` too."""
        reason = runner.decode_reason(vae, z)
        if reason is not None:
            return None, reason
        return runner.decode_frames(vae.decoder, vae.post_quant_conv(z)), None

    with runner.lock.holding(z.device), CAPTURE_GATE.running():
        video, reason = runner.within_memory(serve) or (None, OUT_OF_MEMORY_REASON)
        if video is None:
            runner.fallbacks.took_reference(reason)
            return runner._reference_decode(z, return_dict=return_dict)
        runner.fallbacks.took_graphs()
    video = finish_video(vae, video)
    vae.clear_cache()  # the reference leaves an empty cache behind; keep that observable state the same
    return DecoderOutput(sample=video) if return_dict else (video,)


@torch.compiler.disable
def _routed_decoder_forward(decoder: nn.Module, x, feat_cache=None, feat_idx=[0], first_chunk=False):  # noqa: B006
    """Instance forward of the decoder: one chunk through the graphs, keeping diffusers' cache protocol.

    Serves calls with a feat_cache list whose slots are all empty (chunk 0) or all steady-form tensors
    (2 frames each); anything else (uncached calls, a cache the reference filled) runs the class forward.
    Inside the runner's own reference decode it runs the class forward directly, uncounted.
    """
    runner: WanRunner = installed_runner(decoder)
    if feat_cache is None or runner.in_reference:
        return reference_forward(decoder, x, feat_cache, feat_idx, first_chunk)
    with runner.lock.holding(x.device), CAPTURE_GATE.running():
        reason = runner.region_reason(decoder, x)
        done = None if reason else run_graph_chunk(runner.graphs[runner.graph_key(x)], decoder, x, feat_cache, first_chunk)
        if done is None:
            runner.fallbacks.took_reference(reason or CHUNK1_FORM)
            with runner.serving_reference():
                return reference_forward(decoder, x, feat_cache, feat_idx, first_chunk)
        y, slots = done
        feat_idx[0] += slots
        runner.fallbacks.took_graphs()
    return y
