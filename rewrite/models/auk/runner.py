"""Decode driver for an optimized `AuKVAE`: the captured decode graph, replayed from CUDA graphs.

`AuKRunner.install(vae)` sets instance attributes and nothing else (no parameter, buffer or submodule
changes, so `state_dict()` is untouched):
  * `vae.decode`: the model's own latent check (its ValueError), the guards, then the route below;
    `AuKVAE.forward` calls `self.decode`, so `vae(z)` takes the same route;
  * `vae.decode_tiles`: a generator of `(emit_start_frame, waveform)` pieces as they finish (streaming);
  * `vae._rewrite_runner`: this runner (read by `report` and `warmup`).
`AuKRunner.uninstall(vae)` removes them. When a guard objects (autograd, hooks or instance `forward`
wrappers inside the decoder, global module hooks, mixed parameter/buffer dtypes or devices, latents unlike
the parameters, another CUDA graph capture in progress, a failed export), the call runs the class's own
`AuKVAE.decode` and the reason is logged once and counted in the report.

Routes (the captured graph is one decode of normalised latents, batch and frames dynamic):
  * no CUDA (CPU tensors): the graph runs eagerly on the whole clip;
  * ``lossless``: one CUDA graph per exact (batch, frames, dtype, device), nothing padded or tiled, so the
    output is bit-identical to eager (a replay runs the kernels the eager call runs, on the same shapes);
  * ``channels_last``: a clip of at most ``tile_frames`` latent frames is right-padded with
    `AuKVAE.pad_latent()` to the smallest bucket of ``compile_shapes`` that holds it and replayed from that
    bucket's graph; a longer clip is decoded in the overlapping windows of `plan_tiles` (halo from
    `decode_context_frames()`, the last window shrunk to a bucket), equal-width windows stacked along the
    batch and replayed together as one batched graph (batches of at most ``MAX_TILE_BATCH`` windows, see
    `tile_batches`). Padding changes only the last samples of the clip (the activations'
    replicate padding sees decoded pad frames instead of the clip end) and tiling only the rounding. The
    channels_last graphs' Triton kernels skip a padded window's tail past the clip end plus the right
    decode context (`rewrite.kernels.valid_length`), which changes no kept sample.
Graph memory: every bucket-sized graph lives in one shared private pool (captured largest first by
`warmup`); exact-length graphs (lossless, or a width no bucket serves) live in another pool that is retired
as a whole generation when it holds ``max_graphs`` graphs (never one graph at a time, see
`rewrite.runtime.graphs.GraphPool`). Outputs are copied out of the graph before the next replay. A failed
CUDA graph capture is logged, shown in the report, and that shape then runs the graph eagerly. Replacing
weight tensors (``load_state_dict(assign=True)``, ``.to()``) retires every CUDA graph; in-place updates are
seen by the replays.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from typing import Iterable, Iterator, Sequence

import torch
from torch import nn

from rewrite.models.auk.capture import GRAPH_NAME, capture_auk_decode, reference_decode
from rewrite.capture.export import CapturedGraph
from rewrite.levels import level_enables
from rewrite.ops import compile_ahead
from rewrite.kernels.conv1d import conv1d as triton_conv1d
from rewrite.kernels import valid_length
from rewrite.reporting import GraphReport, WarmupResult
from rewrite.runtime import disk_cache, guards
from rewrite.runtime.graph_memory import GraphMemoryReport, SizeMemory
from rewrite.runtime.graphs import CudaGraphBackend, GraphPool, describe_key, static_buffer_mode
from rewrite.runtime.locks import CAPTURE_GATE
from rewrite.runtime.runner import EVERY_LEVEL, OUT_OF_MEMORY_REASON, DecoderRunner, installed_runner
from rewrite.runtime.tiles import Window, plan_tiles

logger = logging.getLogger(__name__)

DEFAULT_COMPILE_SHAPES = (160, 320, 640)
DEFAULT_MAX_GRAPHS = 8
#: most windows of one width replayed as one batched graph (chunks are powers of two up to this)
MAX_TILE_BATCH = 8
#: latent frames computed past a padded window's clip end beyond the decode's right context (rounding slack)
VALID_MARGIN_EXTRA = 2


def uniform_tensors_reason(vae: nn.Module, z: torch.Tensor) -> str | None:
    """Graphs are captured per (dtype, device): parameters, buffers and latents must all agree."""
    reason = guards.uniform_parameters_reason(vae, z)
    if reason is not None:
        return reason
    odd = sorted({f"{name} ({b.dtype} on {b.device})" for name, b in vae.named_buffers()
                  if b.dtype != z.dtype or b.device != z.device})
    if odd:
        shown = ", ".join(odd[:3]) + (f" and {len(odd) - 3} more" if len(odd) > 3 else "")
        return f"buffers unlike the latents ({z.dtype} on {z.device}): {shown}"
    return None


@contextlib.contextmanager
def cudnn_benchmarking():
    """cuDNN picks each convolution's algorithm by timing the candidates (``torch.backends.cudnn.benchmark``)
    while a graph is warmed up and captured; the captured graph keeps those choices. Restored afterwards."""
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = previous


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _frame_counts(frames) -> tuple[int, ...] | None:
    """`warmup`'s `frames`: None, or a list of positive latent frame counts; a clear error for anything else."""
    if frames is None:
        return None
    expected = "frames must be a list of positive latent frame counts, e.g. [250, 600]"
    if isinstance(frames, (str, bytes)) or not isinstance(frames, Iterable):
        hint = f" (did you mean [{frames!r}]?)" if isinstance(frames, int) and not isinstance(frames, bool) else ""
        raise TypeError(f"warmup: {expected}; got {frames!r}{hint}")
    values = tuple(frames)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"warmup: {expected}; got the entry {value!r}")
    return values


def tile_batches(count: int, largest: int = MAX_TILE_BATCH) -> list[int]:
    """How `count` equal-width windows are stacked: one batch when `count` <= `largest`, else batches of
    `largest` and one of the rest (e.g. 5 -> [5], 13 -> [8, 5]). One replay of a batch of n windows costs
    less than replays of smaller batches (docs/tuning.md section 5, "Notes moved from the runners"), and a width has at most
    `largest` batch shapes."""
    return [largest] * (count // largest) + ([count % largest] if count % largest else [])


class AuKRunner(DecoderRunner):
    """The captured decode graph of one `AuKVAE`, its CUDA graphs, and the code that routes a decode."""

    model_name = "auk"
    OPTIONS = {"cache_dir": EVERY_LEVEL, "compile_shapes": ("channels_last",), "tile_frames": ("channels_last",),
               "max_graphs": EVERY_LEVEL, "cudnn_benchmark": ("channels_last",)}
    HIDDEN_OPTIONS = ("graph_backend",)  # tests: a stand-in for CUDA graphs

    def __init__(self, vae: nn.Module, level: str, rewrite_graph, *, compile_shapes: Sequence[int] = DEFAULT_COMPILE_SHAPES,
                 tile_frames: int | None = None, max_graphs: int = DEFAULT_MAX_GRAPHS, cudnn_benchmark: bool = False,
                 cache_dir=None, graph_backend=None) -> None:
        shapes = () if isinstance(compile_shapes, (str, bytes)) or not isinstance(compile_shapes, Iterable) else compile_shapes
        self.compile_shapes = tuple(sorted({_positive_int("compile_shapes entry", s) for s in shapes}))
        if not self.compile_shapes:
            raise ValueError(f"compile_shapes must be a non-empty sequence of latent frame counts, got {compile_shapes!r}")
        self.tile_frames = _positive_int("tile_frames", self.compile_shapes[-1] if tile_frames is None else tile_frames)
        self.max_graphs = _positive_int("max_graphs", max_graphs)
        self.context = vae.decode_context_frames()
        if self.tile_frames <= sum(self.context):
            name = "tile_frames" if tile_frames is not None else "tile_frames (default: the largest compile_shapes entry)"
            raise ValueError(f"{name} must exceed the decode context left + right = {sum(self.context)} "
                             f"latent frames {self.context}, got {self.tile_frames}")
        self.level = level
        self.bucketed = level_enables(level, "channels_last")  # padding and tiling change the last bits
        if not isinstance(cudnn_benchmark, bool):
            raise ValueError(f"cudnn_benchmark must be a bool, got {cudnn_benchmark!r}")
        if cudnn_benchmark and not self.bucketed:
            raise ValueError(f"cudnn_benchmark=True needs level 'channels_last': at {level!r} the graphs run the "
                             "convolution algorithms eager decoding picks, which is what keeps them bit-identical")
        # Off by default: timing the algorithms chose nothing faster than cuDNN's heuristics while the trials'
        # workspaces raised the peak memory of a warm-up many times over (docs/tuning.md section 5, "Notes moved
        # from the runners").
        self.cudnn_benchmark = cudnn_benchmark
        super().__init__(level, rewrite_graph, {"compile_shapes": self.compile_shapes, "tile_frames": self.tile_frames,
                                                "max_graphs": self.max_graphs, "cudnn_benchmark": self.cudnn_benchmark,
                                                "cache_dir": disk_cache.cache_dir_option(cache_dir)})
        self.backend = graph_backend if graph_backend is not None else CudaGraphBackend()
        # (batch, bucket, dtype, device), one shared pool; each capture's timing goes to the report
        self.bucket_graphs = GraphPool(self.backend, on_build=self.cuda_graphs_built)
        self.exact_graphs = GraphPool(self.backend, max_entries=self.max_graphs,  # (batch, frames, dtype, device)
                                      on_build=self.cuda_graphs_built)
        self.capture_failures: dict[tuple, str] = {}
        self._weight_pointers: dict[tuple, tuple[int, ...]] = {}  # per (dtype, device): when the graphs were captured
        self._compiled_ahead: set[tuple] = set()  # (dtype, device) whose Triton kernels compiled in parallel
        # Conv weights packed for the Triton convs (channels_last), kept between calls: the graphs read them, and
        # `_replay` re-packs those whose version counter changed before replaying.
        self.packed_weights = triton_conv1d.PackedWeightCache()
        # per (dtype, device): what the full guards accepted last, re-checked cheaply by the next call
        self._accepted: dict[tuple, guards.AcceptedState] = {}
        self._pad: tuple | None = None  # (mean, log_std, their versions and pointers, pad latent): `pad_latent`
        self._static_tails: dict[tuple, tuple] = {}  # graph key -> (weakref(step), frames, pad) its input's tail holds
        self._valid: dict[torch.device, torch.Tensor] = {}  # valid latent frames of the window, read by the graphs
        self._valid_written: dict[torch.device, int] = {}
        # A plain reference (a cycle through vae._rewrite_runner, which the GC collects): copy.deepcopy of
        # the VAE then gives the copy a runner bound to the copy, as for the Wan runner's bound methods.
        self.vae = vae

    # ---- installation -------------------------------------------------------------------------------
    @classmethod
    def entry_points(cls, vae: nn.Module):
        return [(vae, "decode", _optimized_decode), (vae, "decode_tiles", _optimized_decode_tiles)]

    def install(self, vae: nn.Module) -> None:
        self.vae = vae
        super().install(vae)

    # ---- capture ------------------------------------------------------------------------------------
    def graph_for(self, dtype: torch.dtype, device: torch.device, listing=None) -> CapturedGraph | None:
        """The rewritten decode graph for this dtype/device, captured on first use and again after the decoder
        changed (`DecoderRunner.captured`); None if capture failed."""
        def capture():  # exported and rewritten, or read back from the disk cache
            (graph,) = self.capture_graphs(lambda: [capture_auk_decode(self.vae, dtype, device)], key=(dtype, device),
                                           model=self.vae, root=self.vae, names=(GRAPH_NAME,), dtype=dtype,
                                           device=device)
            return graph

        listing = list(self.vae.decoder.named_modules(prefix="decoder")) if listing is None else listing
        return self.captured((dtype, device), listing, capture, f"{dtype} on {device}")

    def forget_graphs(self, key) -> None:
        """The decode graph of `key` is captured again: every CUDA graph and what was derived from the old one goes."""
        self.bucket_graphs.retire()
        self.exact_graphs.retire()
        self.capture_failures.clear()
        self._static_tails.clear()
        self._accepted.pop(key, None)
        self._weight_pointers.pop(key, None)
        self._compiled_ahead.discard(key)

    def release_device_memory(self) -> None:
        """Every CUDA graph (both pools, their static latents) and the packed conv weights go; the FX graph stays."""
        self.bucket_graphs.retire()
        self.exact_graphs.retire()
        self._static_tails.clear()
        self.packed_weights = triton_conv1d.PackedWeightCache()

    def graph_reports(self) -> list[GraphReport]:
        return [GraphReport.of(g) for g in self.graphs.values.values()]

    def graph_memory(self):
        """The bucket and exact-length pools: each captured shape's pool growth and latent buffer, the total."""
        pools = (("bucket", self.bucket_graphs), ("exact", self.exact_graphs))
        if not any(pool.captures for _, pool in pools):
            return None
        sizes = tuple(SizeMemory(f"{name} {describe_key(key)}", growth, 0, own)
                      for name, pool in pools for key, (growth, own) in pool.memory.items())
        pool_bytes = sum(pool.pool_bytes() for _, pool in pools)
        retired = {"exact-length generation retired": self.exact_graphs.generation} if self.exact_graphs.generation else {}
        return GraphMemoryReport(total=pool_bytes + sum(s.own for s in sizes), pools=pool_bytes, cache_blocks=0,
                                 sizes=sizes, budget=None, retired=retired)

    def cuda_graph_counts(self) -> dict[str, int]:
        return {"bucket graphs": len(self.bucket_graphs), "exact-length graphs": len(self.exact_graphs),
                "exact-length generations retired": self.exact_graphs.generation,
                "capture failures": len(self.capture_failures)}

    @torch.no_grad()  # captures for no-grad decodes, whatever the caller's grad mode (as Wan's warmup)
    def warmup(self, device: torch.device, dtype: torch.dtype, batch: int = 1,
               frames: Sequence[int] | None = None) -> WarmupResult:
        """Capture ahead of time the graphs a decode of `batch` clips of these lengths would capture.

        Exports and rewrites the decode graph for (dtype, device), then captures
        the CUDA graphs of batch `batch` for `frames` latent frames, largest first: at ``channels_last`` by
        default every bucket of ``compile_shapes`` (one shared pool, so the smaller graphs reuse the largest
        one's memory); at ``lossless`` only the exact lengths given in `frames`. A clip longer than
        ``tile_frames`` also replays windows stacked along the batch (``batch`` times 2, 4 or 8): those
        graphs are captured by its first decode. Raises what a capture failure raised.
        """
        widths = _frame_counts(frames)
        batch = _positive_int("batch", batch)
        start, mark = time.perf_counter(), len(self.timings)
        z = torch.zeros(batch, 1, self.vae.config.latent_dim, dtype=dtype, device=device)
        with self.lock.holding(z.device), CAPTURE_GATE.running():
            reason = self.fallback_reason(z)
            if reason is not None:
                raise RuntimeError(f"warmup: the graphs cannot serve {dtype} on {device}: {reason}")
            if not self.backend.can_capture(device):
                return WarmupResult([], time.perf_counter() - start,
                                    f"no CUDA graphs on {device.type}: the decode graph is captured and runs eagerly",
                                    breakdown=self.timings.records(mark))
            if widths is None:
                widths = self.compile_shapes if self.bucketed else ()
            for width in sorted(set(widths), reverse=True):
                pool, key = self._pool_for(batch, width, z.dtype, z.device)
                self._capture(pool, key, batch, width, z.dtype, z.device)
        note = None if widths else "lossless captures exact lengths only: pass frames=[...] for the CUDA graphs"
        return WarmupResult([(batch, w) for w in sorted(set(widths), reverse=True)], time.perf_counter() - start, note,
                            breakdown=self.timings.records(mark))

    # ---- guards -------------------------------------------------------------------------------------
    def fallback_reason(self, z: torch.Tensor) -> str | None:
        """Why this call cannot run through the graph, or None (exports the graph on first use).

        Cheap enough to run on every decode: a call whose full checks passed leaves a
        `guards.AcceptedState`, and the next call only re-checks that nothing those checks look at changed
        (C-level loops over prepared lists); otherwise the full checks run (hooks, train mode, a decoder
        changed since its capture, which captures it again): the parameters' dtype/device
        agreement on the graph's own weight list (`CapturedGraph.weights`, owners resolved once), the full
        module walk of `uniform_tensors_reason` only to word a reason once something disagrees. With that
        list at hand they also retire every CUDA graph when a weight tensor was replaced since the captures.
        """
        vae = self.vae
        first = next(vae.parameters(), None)
        if first is not None and (first.dtype != z.dtype or first.device != z.device):
            return uniform_tensors_reason(vae, z)
        key = (z.dtype, z.device)
        accepted = self._accepted.get(key)
        if (accepted is not None and accepted.holds(vae.decoder) and guards.autograd_reason(vae, z) is None
                and guards.autocast_reason(z.device) is None and guards.capture_in_progress_reason(z.device) is None):
            return None  # nothing the checks below look at has changed since they accepted a call
        self._accepted.pop(key, None)
        listing = list(vae.decoder.named_modules(prefix="decoder"))
        reason = (
            guards.autograd_reason(vae, z)
            or guards.autocast_reason(z.device)
            or guards.hook_reason(vae.decoder, "decoder", modules=listing)
            or guards.training_reason(listing)
            or guards.tensor_attribute_reason(listing)
            or guards.capture_in_progress_reason(z.device)
        )
        if reason is None and self.graph_for(z.dtype, z.device, listing) is None:
            reason = self.graphs.errors[(z.dtype, z.device)]
        if reason is None:
            try:
                weights = self.graphs[(z.dtype, z.device)].weights(vae)
            except AttributeError as error:  # e.g. a parameter replaced by a plain tensor attribute
                return f"a graph weight is no longer a parameter or buffer of that name: {error}"
            pointers = tuple(0 if w is None else w.data_ptr() for w in weights)
            if pointers != self._weight_pointers.get(key):  # else the tensors checked last time: same dtypes, devices
                if any(w.dtype != z.dtype or w.device != z.device for w in weights if w is not None):
                    return uniform_tensors_reason(vae, z) or "graph weights unlike the latents"
                self._retire_if_replaced(key, pointers)
            locations = self.graphs[key].weight_locations(vae)
            if locations is not None:
                self._accepted[key] = guards.AcceptedState(vae.decoder, listing, locations)
        return reason

    def _retire_if_replaced(self, key: tuple, pointers: tuple[int, ...]) -> None:
        """Retire every CUDA graph when a weight tensor was replaced since the graphs were captured (`pointers`:
        the graph weights' data pointers now). A tensor's dtype or device cannot change without its storage."""
        previous = self._weight_pointers.get(key)
        if previous is not None and previous != pointers:
            self.bucket_graphs.retire()
            self.exact_graphs.retire()
            self.capture_failures.clear()
        self._weight_pointers[key] = pointers

    # ---- graph execution ----------------------------------------------------------------------------
    def run_window(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised latents `[B, frames, latent_dim]` -> waveform `[B, frames * hop]`, the graph run eagerly."""
        graph = self.graphs[(z.dtype, z.device)]
        (wave,) = self._run(graph, graph.weights(self.vae), z)
        return wave

    def _run(self, graph: CapturedGraph, weights: list, z: torch.Tensor) -> list[torch.Tensor]:
        """The decode graph over `weights`, its Triton convs reading this runner's packed weights."""
        with triton_conv1d.packed_weight_cache(self.packed_weights):
            return graph(weights, z)

    def _step_fn(self, batch: int, width: int, dtype: torch.dtype, device: torch.device):
        """The function a CUDA graph captures: the decode graph over the weights as they are now (its Triton
        kernels compiled ahead first, once per dtype and device). At ``channels_last`` its Triton kernels read
        the window's valid frame count from `_valid_frames` (`rewrite.kernels.valid_length`): they skip the padded
        tail past the decode's right context, which no kept sample depends on."""
        self._compile_kernels_ahead(batch, width, dtype, device)
        graph = self.graphs[(dtype, device)]
        weights = graph.weights(self.vae)
        if not self.bucketed:
            return lambda z: self._run(graph, weights, z)
        valid, margin = self._valid_frames(device), self.context[1] + VALID_MARGIN_EXTRA

        def step(z: torch.Tensor) -> list[torch.Tensor]:
            with valid_length.valid_frames(valid, width, margin):
                return self._run(graph, weights, z)

        return step

    def _valid_frames(self, device: torch.device) -> torch.Tensor:
        """The device's one-element count of valid latent frames that the channels_last graphs read."""
        valid = self._valid.get(device)
        if valid is None:
            with static_buffer_mode():
                valid = self._valid[device] = torch.zeros(1, dtype=torch.int32, device=device)
            self._valid_written[device] = 0
        return valid

    def _compile_kernels_ahead(self, batch: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        """Before the first capture of a (dtype, device): one pass of the graph in which every Triton launch only
        submits its compile to a thread pool (`rewrite.ops.compile_ahead`), so the kernels compile in parallel
        instead of one by one during the capture's eager run. Nothing is computed; a failure is logged and
        left to the capture, which compiles what is missing itself."""
        if (dtype, device) in self._compiled_ahead or device.type != "cuda":
            return
        self._compiled_ahead.add((dtype, device))
        try:
            with compile_ahead.compile_ahead() as active, torch.no_grad():
                if active:
                    self.run_window(torch.zeros(batch, width, self.vae.config.latent_dim, dtype=dtype, device=device))
        except Exception as error:  # noqa: BLE001 - only a speed-up: the capture compiles what is missing
            logger.warning("compiling the Triton kernels ahead failed (%s: %s); they compile during the capture",
                           type(error).__name__, error)

    def _capture(self, pool: GraphPool, key: tuple, batch: int, width: int, dtype: torch.dtype, device: torch.device):
        """The step of `key` from `pool`, captured on first use over a static latent buffer."""
        latent_dim = self.vae.config.latent_dim
        with cudnn_benchmarking() if self.cudnn_benchmark else contextlib.nullcontext():
            return pool.get(key, lambda: self._step_fn(batch, width, dtype, device),
                            lambda: [torch.empty(batch, width, latent_dim, dtype=dtype, device=device)])

    def _pool_for(self, batch: int, width: int, dtype: torch.dtype, device: torch.device) -> tuple[GraphPool, tuple]:
        bucket = self.bucketed and width in self.compile_shapes
        return (self.bucket_graphs if bucket else self.exact_graphs), (batch, width, dtype, device)

    def _replay(self, z: torch.Tensor, width: int, pad: torch.Tensor | None) -> torch.Tensor:
        """Decode `z` `[B, F, D]` (F <= width, right-padded with `pad` to `width`) from the graph of that shape.

        Returns the graph's own output `[B, width * hop]` (overwritten by the next replay: copy what you
        keep), or an eager result when the CUDA graph of this shape could not be captured.
        """
        batch, frames, _ = z.shape
        pool, key = self._pool_for(batch, width, z.dtype, z.device)
        step = None
        if key not in self.capture_failures:
            try:
                step = self._capture(pool, key, batch, width, z.dtype, z.device)
            except torch.OutOfMemoryError:
                raise  # not a failed capture: the decode frees memory and tries again (`within_memory`)
            except Exception as error:  # logged, reported; this shape runs eagerly from now on
                self.capture_failures[key] = f"CUDA graph capture failed for {batch}x{width} frames: {type(error).__name__}: {error}"
                self.fallbacks.note(self.capture_failures[key])
        if step is None:
            window = z if frames == width else torch.cat([z, pad.expand(batch, width - frames, -1)], dim=1)
            return self.run_window(window)
        (static,) = step.inputs
        static[:, :frames].copy_(z)
        tail = self._static_tails.get(key)
        if frames < width and (tail is None or tail[0]() is not step or tail[1] != frames or tail[2] is not pad):
            static[:, frames:].copy_(pad.expand(batch, width - frames, -1))  # the graph never writes its input
            self._static_tails[key] = (weakref.ref(step), frames, pad)
        if self.bucketed and self._valid_written.get(z.device) != frames:
            self._valid_frames(z.device).fill_(frames)
            self._valid_written[z.device] = frames
        self.packed_weights.refresh()  # weights updated in place since the last call: re-pack what the graph reads
        return step.replay()[0]

    def pad_latent(self) -> torch.Tensor:
        """`AuKVAE.pad_latent()`, computed again only when the latent statistics changed (other tensors, or
        in-place writes: their version counters), so a padded decode launches no kernels for it."""
        mean, log_std = self.vae.global_mean, self.vae.global_log_std
        try:
            state = (mean._version, log_std._version, mean.data_ptr(), log_std.data_ptr())
        except RuntimeError:  # inference tensors have no version counter
            return self.vae.pad_latent()
        cached = self._pad
        if cached is None or cached[0] is not mean or cached[1] is not log_std or cached[2] != state:
            cached = self._pad = (mean, log_std, state, self.vae.pad_latent())
        return cached[3]

    # ---- decode -------------------------------------------------------------------------------------
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """`AuKVAE.decode` through the graphs, or through the reference when a guard objects. One call of
        this module at a time (`lock`), its work on the caller's current stream."""
        self.vae._check_latents(z)  # the model's own ValueError for bad latents
        with self.lock.holding(z.device), CAPTURE_GATE.running():
            return self._decode_held(z)

    def _decode_held(self, z: torch.Tensor) -> torch.Tensor:
        def serve() -> tuple[torch.Tensor | None, str | None]:
            """(wave, None) through the graphs, or (None, why not); the guards may capture the graph, so they
            run inside `within_memory` too."""
            reason = self.fallback_reason(z)
            return (None, reason) if reason is not None else (self._decode_optimized(z), None)

        wave, reason = self.within_memory(serve) or (None, OUT_OF_MEMORY_REASON)
        if wave is None:
            self.fallbacks.took_reference(reason)
            return reference_decode(self.vae, z)
        return wave

    def _decode_optimized(self, z: torch.Tensor) -> torch.Tensor:
        """The decode through the graphs: eagerly without CUDA graphs, else by the routes of the module
        docstring (reports the route taken)."""
        vae = self.vae
        if not self.backend.can_capture(z.device):
            self.fallbacks.took_graphs(f"graph run eagerly (no CUDA graphs on {z.device.type})")
            return self.run_window(z)
        batch, frames, _ = z.shape
        hop = vae.config.hop_length
        if not self.bucketed:
            wave = self._replay(z, frames, None).clone()
            self._took(f"CUDA graph, exact length {frames}", (batch, frames, z.dtype, z.device))
            return wave
        pad = self.pad_latent()
        if frames <= self.tile_frames:
            width = next((b for b in self.compile_shapes if b >= frames), frames)
            wave = self._replay(z, width, pad)[:, : frames * hop].clone()
            what = f"bucket {width}" + (f" ({frames} frames padded)" if width > frames else "") if width in self.compile_shapes else f"exact length {frames}"
            self._took(f"CUDA graph, {what}", (batch, width, z.dtype, z.device))
            return wave
        windows = self.plan(frames)
        wave = torch.empty(batch, frames * hop, dtype=z.dtype, device=z.device)
        keys = []
        for group in _equal_width_groups(windows):
            for chunk in _chunks(group, tile_batches(len(group))):
                width = chunk[0].window_frames
                stacked = torch.cat([z[:, w.window_start : w.window_start + width] for w in chunk]) if len(chunk) > 1 \
                    else z[:, chunk[0].window_start : chunk[0].window_start + width]
                keys.append((stacked.shape[0], width, z.dtype, z.device))
                out = self._replay(stacked, width, pad)
                for i, w in enumerate(chunk):
                    offset = w.emit_start - w.window_start
                    wave[:, w.emit_start * hop : w.emit_end * hop] = \
                        out[i * batch : (i + 1) * batch, offset * hop : (offset + w.emit_end - w.emit_start) * hop]
        widths = sorted({w.window_frames for w in windows}, reverse=True)
        self._took(f"CUDA graphs, {len(windows)} tiled windows of {'/'.join(map(str, widths))} frames", *keys)
        return wave

    def plan(self, frames: int) -> list[Window]:
        """The decode windows of a clip of `frames` latent frames (one window when it needs no tiling)."""
        left, right = self.context
        return plan_tiles(frames, self.tile_frames, left, right, sizes=self.compile_shapes)

    def decode_tiles(self, z: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield `(emit_start_frame, waveform [B, n * hop])` pieces in order as windows finish.

        Only ``channels_last`` tiles; otherwise (and for a clip that fits one window) the whole decode is
        one piece starting at frame 0. The pieces concatenated are what `decode` returns up to rounding:
        `decode` replays equal-width windows stacked along the batch, this one window at a time. The
        guards run again before every later piece (the caller runs between pieces): replaced weights retire
        the graphs, and a piece a guard objects to is decoded from its window by `AuKVAE.decode`.
        """
        vae = self.vae
        vae._check_latents(z)
        batch, frames, _ = z.shape
        with self.lock.holding(z.device), CAPTURE_GATE.running():
            whole = (not self.bucketed or frames <= self.tile_frames or self.fallback_reason(z) is not None
                     or not self.backend.can_capture(z.device))
            if whole:
                piece = self._decode_held(z)
        if whole:
            yield 0, piece
            return
        hop = vae.config.hop_length
        windows = self.plan(frames)
        for w in windows:  # the lock is held per window, never across a yield (the caller runs in between)
            with self.lock.holding(z.device), CAPTURE_GATE.running():
                window = z[:, w.window_start : w.window_start + w.window_frames]
                reason = self.fallback_reason(z)
                if reason is not None:
                    self.fallbacks.took_reference(reason)
                    out = reference_decode(vae, window)
                else:
                    out = self._replay(window, w.window_frames, self.pad_latent())
                    self._took(f"CUDA graphs, streaming {len(windows)} tiled windows",
                               (batch, w.window_frames, z.dtype, z.device))
                offset = w.emit_start - w.window_start
                piece = out[:, offset * hop : (offset + w.emit_end - w.emit_start) * hop].clone()
            yield w.emit_start, piece

    def _took(self, detail: str, *keys: tuple) -> None:
        """Report a graph-path call; `keys` are the CUDA graph shapes it used (those whose capture failed ran eagerly)."""
        if any(key in self.capture_failures for key in keys):
            if detail.startswith("CUDA graphs"):
                detail = detail.replace("CUDA graphs", "CUDA graphs (eager where capture failed)", 1)
            else:
                detail = detail.replace("CUDA graph", "graph run eagerly (capture failed)", 1)
        self.fallbacks.took_graphs(detail)


def _equal_width_groups(windows: list[Window]) -> list[list[Window]]:
    groups: dict[int, list[Window]] = {}
    for w in windows:
        groups.setdefault(w.window_frames, []).append(w)
    return list(groups.values())


def _chunks(items: list, sizes: list[int]) -> Iterator[list]:
    start = 0
    for size in sizes:
        yield items[start : start + size]
        start += size


@torch.compiler.disable  # torch.compile on top runs this as it is: the graphs are already compiled
def _optimized_decode(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Replacement for `AuKVAE.decode` (bound to the instance by `AuKRunner.install`)."""
    return installed_runner(vae).decode(z)


@torch.compiler.disable
def _optimized_decode_tiles(vae: nn.Module, z: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    """`vae.decode_tiles(z)`: streaming decode (installed by `AuKRunner.install`)."""
    return installed_runner(vae).decode_tiles(z)


__all__ = ["AuKRunner", "DEFAULT_COMPILE_SHAPES", "DEFAULT_MAX_GRAPHS", "MAX_TILE_BATCH", "tile_batches"]
