"""Streamed Wan decodes: `vae.decode_stream(z)` and `rewrite.stream(vae, ...)` sessions (docs/design.md 11.5).

Both decode a clip latent frame by latent frame through the runner's graphs (the reference decoder where a
guard objects) and hand each piece to the caller as soon as it is decoded: 1 output frame for a clip's
first latent frame, `temporal_factor` (4) for every later one, unpatchified and clamped as `decode` does.
The pieces concatenated along dim 2 are `torch.equal` to `vae.decode(z).sample` at `lossless`:

* `decode_stream(z)` runs `post_quant_conv` over the whole `z`, as diffusers' `_decode` does.
* A session never sees the whole latent, so it runs `post_quant_conv` one latent frame at a time. That is
  the whole-clip answer only where the conv library computes a frame the same way whatever the clip length
  (not so in general: on this machine's CPU, oneDNN's fp32 1x1x1 conv of 48 channels at 60 x 104 differs
  from 8 frames on). `frame_local_post_quant_conv` checks it per shape and clip length before a push makes
  the clip that long; where it fails the push raises instead of answering differently.

State and concurrency. A clip's state is its causal convs' caches (`ClipState`, one per batch slice), owned
by the clip: a session or a stream holds the runner's lock per call (a push, a piece), never between
calls, and nothing another call does changes it. On the CUDA-graph path the caches live between calls in
the static cache buffers of the shape's `CudaGraphSteps` (`ClipState.resident`; the buffers are views into one
block shared by the module's sizes, whose occupant the clip is: `rewrite.runtime.graph_memory.CacheArena`),
and whoever uses that block next (a plain decode, another clip, a capture) first hands the paused clip a copy
of them (`CudaGraphSteps.release` -> `ClipState.save`); the clip copies them back in before its next step.
A clip alone on its shape copies nothing. Memory is the caches (plus one saved copy once another call took
the buffers): no video is kept between calls.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from rewrite.models.wan.capture import cache_slot_count, reference_forward
from rewrite.runtime.graphs import static_buffer_mode
from rewrite.runtime.locks import CAPTURE_GATE
from rewrite.runtime.runner import OUT_OF_MEMORY_REASON, installed_runner
from rewrite.models.wan.frames import CHUNK1_FORM, decodes_tiled, finish_video, run_graph_chunk, steady_form

if TYPE_CHECKING:
    from rewrite.models.wan.runner import WanRunner

STREAMED = "streamed"  # the report's detail for a call a stream or session served from the graphs


class ClipState:
    """One batch slice of a streamed clip between calls: how many latent frames it has decoded and its
    causal convs' caches, either in diffusers' cache-list form (`feat_map`, which the reference decoder and
    the eager graphs take) or in the static caches of the `CudaGraphSteps` it last ran on (`resident`)."""

    def __init__(self, slots: int) -> None:
        self.frames = 0
        self.feat_map: list = [None] * slots
        self.resident = None  # the CudaGraphSteps whose static caches hold this state (its block's occupant is us)
        self._saved: list[Tensor] | None = None  # where `save` copies them (kept for the next time)

    def save(self, caches: list[Tensor]) -> None:
        """Copy the static caches this state is resident in into its own buffers (`CudaGraphSteps.release`
        calls it, under the runner's lock, before anything else writes them)."""
        if self._saved is None or [s.shape for s in self._saved] != [c.shape for c in caches]:
            with static_buffer_mode():  # plain tensors: a later save may write them in any mode
                self._saved = [c.clone() for c in caches]
        else:
            for mine, static in zip(self._saved, caches):
                mine.copy_(static)
        self.feat_map[: len(caches)] = self._saved
        self.resident = None

    def take_back(self) -> None:
        """Bring the state into `feat_map` (from the static caches it is resident in, if any)."""
        if self.resident is not None:
            self.resident.release()


def _replay(steps, state: ClipState, x: Tensor) -> Tensor:
    """One latent frame of `state`'s clip through the shape's CUDA-graph steps, whose caches become (or stay)
    the clip's. Returns the graph's own output tensor: copy it before the next replay."""
    if state.frames == 0:
        state.take_back()
        y = steps.first(x)  # releases a paused clip first
    else:
        if state.resident is not steps:
            state.take_back()  # from stale steps (evicted, recaptured) the clip was left in
            steps.release()
            current = torch.cuda.current_stream(x.device) if x.is_cuda else None
            for static, mine in zip(steps.caches, state.feat_map):
                static.copy_(mine)
                if current is not None:  # `mine` may have been made on another stream
                    mine.record_stream(current)
        y = steps.next(x)
    steps.hold(state)
    state.resident = steps
    return y


def decode_frame(runner: WanRunner, decoder: nn.Module, state: ClipState, x: Tensor,
                 reason: str | None) -> tuple[Tensor, str | None]:
    """The decoder output of the next latent frame `x` ([b, z_dim, 1, h, w], after post_quant_conv) of the
    clip in `state`, and why the reference decoder served it (None: the graphs did). `reason` is the guards'
    verdict for the call. The caller holds the runner's lock and the capture gate, and copies the output
    before the next step (on the CUDA-graph path it is the graph's own tensor)."""
    first = state.frames == 0

    def on_graphs() -> tuple[Tensor | None, str | None]:
        steps = runner.cuda_steps(decoder, x)
        if steps is not None and (first or state.resident is not None or steady_form(state.feat_map[: len(steps.caches)])):
            return _replay(steps, state, x), None
        state.take_back()
        done = run_graph_chunk(runner.graphs[runner.graph_key(x)], decoder, x, state.feat_map, first)
        return (done[0], None) if done is not None else (None, CHUNK1_FORM)

    if reason is None:  # out of memory: the module's graphs freed and tried again, then the reference
        y, reason = runner.within_memory(on_graphs) or (None, OUT_OF_MEMORY_REASON)
    if reason is not None:
        state.take_back()
        with runner.serving_reference():
            y = reference_forward(decoder, x, state.feat_map, [0], first)
    state.frames += 1
    return y, reason


class _Clip:
    """A streamed clip: one `ClipState` per batch slice (one per row where `enable_slicing()` makes
    `decode` split the batch, else one), all at the same latent frame."""

    def __init__(self, vae: nn.Module, batch: int) -> None:
        self.sliced = vae.use_slicing and batch > 1
        slots = cache_slot_count(vae.decoder)
        self.states = [ClipState(slots) for _ in range(batch if self.sliced else 1)]

    @property
    def frames(self) -> int:
        return self.states[0].frames

    def rows(self, z: Tensor) -> tuple[Tensor, ...]:
        return z.split(1) if self.sliced else (z,)

    def reason(self, runner: WanRunner, vae: nn.Module, rows: tuple[Tensor, ...]) -> str | None:
        """The guards' verdict for latent `rows` (`self.rows(z)`): checked, and the graphs captured, at the
        shape the decoder runs, a row slice's where the batch is sliced (every row has that shape)."""
        return runner.decode_reason(vae, rows[0])

    def decode(self, runner: WanRunner, vae: nn.Module, xs: list[list[Tensor]], reason: str | None) -> Tensor:
        """The decoder output [B, C, n, H, W] of the next latent frames, `xs[r]` the frames of row slice r
        (after post_quant_conv), before unpatchify and clamp. The caller holds the lock and the gate, and
        reports the call (`self.taken`: why the reference served a frame, or None)."""
        first, count = self.frames, len(xs[0])
        n = sum(1 if f == 0 else runner.temporal_factor for f in range(first, first + count))
        video, row, self.taken = None, 0, None
        for state, frames in zip(self.states, xs):
            start, b = 0, frames[0].shape[0]
            for x in frames:
                y, why = decode_frame(runner, vae.decoder, state, x, reason)
                self.taken = self.taken or why
                if video is None:
                    video = y.new_empty((sum(f[0].shape[0] for f in xs), y.shape[1], n, *y.shape[3:]))
                video[row : row + b, :, start : start + y.shape[2]] = y
                start += y.shape[2]
            row += b
        return video

    def report(self, runner: WanRunner) -> None:
        if self.taken is None:
            runner.fallbacks.took_graphs(STREAMED)
        else:
            runner.fallbacks.took_reference(self.taken)


def _pre_forward(vae: nn.Module) -> None:
    """What diffusers' `apply_forward_hook` does before `decode`: an accelerate offload hook's `pre_forward`."""
    hook = getattr(vae, "_hf_hook", None)
    if hook is not None and hasattr(hook, "pre_forward"):
        hook.pre_forward(vae)


# ------------------------------------------------------------------------------------------ decode_stream


@torch.compiler.disable
def decode_stream(vae: nn.Module, z: Tensor) -> Iterator[tuple[int, Tensor]]:
    """`vae.decode_stream(z)`: yields `(first_frame_index, frames)` as each latent frame is decoded, frames
    [B, 3, n, H, W] (n = 1 for the first latent frame, `temporal_factor` for each later one).

    Concatenated along dim 2 the pieces are `torch.equal` to `vae.decode(z).sample`: post_quant_conv runs
    over the whole `z` first, slicing splits the batch as `decode` does, and where `enable_tiling()` makes
    `decode` tile `z`, the whole tiled decode is the one piece (0, video). Bad latents raise `ValueError`
    here, at the call. The runner's lock is held per piece, never across a `yield`; the guards run again for
    every piece, and a piece they object to is decoded by the reference decoder from the clip's caches.
    """
    runner: WanRunner = installed_runner(vae)
    runner.check_latents(z)
    return _pieces(runner, vae, z)


def _pieces(runner: WanRunner, vae: nn.Module, z: Tensor) -> Iterator[tuple[int, Tensor]]:
    _pre_forward(vae)
    if decodes_tiled(vae, z.shape[3], z.shape[4]):
        yield 0, vae.decode(z).sample
        return
    clip, xs, start = _Clip(vae, z.shape[0]), None, 0
    rows = clip.rows(z)
    for i in range(z.shape[2]):
        with runner.lock.holding(z.device), CAPTURE_GATE.running():
            reason = clip.reason(runner, vae, rows)
            if xs is None:
                xs = [vae.post_quant_conv(row) for row in rows]
            video = clip.decode(runner, vae, [[x[:, :, i : i + 1]] for x in xs], reason)
            clip.report(runner)
        yield start, finish_video(vae, video)
        start += video.shape[2]


# ------------------------------------------------------------------------------------------ sessions


class StreamSession:
    """A streaming decode of one clip after another, for causal generation (`rewrite.stream`).

    `push(z)` decodes the next latent frames of the clip and returns their frames; `reset()` starts a new
    clip; `close()` (or leaving a `with` block) ends the session. Contract: the pushes of a clip
    concatenated along dim 2 are `torch.equal` to `vae.decode(z_clip).sample`, `z_clip` the pushed chunks
    concatenated, at `lossless` (for a plain VAE on the reference path, bit for bit too). A session runs
    `post_quant_conv` per latent frame, not over the whole clip, so each push first checks, per shape and
    clip length, that the conv library gives each frame what it gives the whole clip
    (`frame_local_post_quant_conv`); where it does not, the push raises `RuntimeError` and leaves the clip
    as it was. Slicing and tiling are taken as set when the clip starts; a size `decode` would tile raises
    `ValueError` (tiled decodes do not stream). The state is the clip's caches (design.md 11.5): other
    decodes and sessions of the VAE in between never change its results. One session serves one caller at
    a time (its calls are serialised); the runner's lock is held per push.
    """

    def __init__(self, vae: nn.Module, *, batch: int = 1, height: int, width: int, dtype=None, device=None):
        runner = installed_runner(vae) if isinstance(vae, nn.Module) else None
        if not getattr(runner, "decodes_streams", False):
            what = type(vae).__name__
            if runner is not None:
                raise TypeError(f"stream: sessions decode Wan VAEs; {what} streams with vae.decode_tiles(z)")
            raise TypeError(f"stream expects an optimized AutoencoderKLWan (call rewrite.optimize first); got {what}")
        for name, value in (("batch", batch), ("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"stream: {name} must be a positive int (latent sizes), got {value!r}")
        parameter = next(vae.parameters())
        self.vae, self.batch, self.height, self.width = vae, batch, height, width
        self.dtype = dtype if dtype is not None else parameter.dtype
        self.device = torch.device(device) if device is not None else parameter.device
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"stream: dtype must be a torch.dtype, got {dtype!r}")
        self._lock = threading.Lock()
        self._closed = False
        self._start(runner)

    def _start(self, runner: WanRunner) -> None:
        if decodes_tiled(self.vae, self.height, self.width):
            raise ValueError(f"stream: latents of {self.height}x{self.width} are decoded tiled (enable_tiling()), "
                             "which does not stream; call vae.disable_tiling() or decode whole clips")
        self._runner, self._clip, self._output_frames = runner, _Clip(self.vae, self.batch), 0

    @property
    def latent_frames(self) -> int:
        """Latent frames pushed into the current clip."""
        return 0 if self._closed else self._clip.frames

    @property
    def output_frames(self) -> int:
        """Frames returned for the current clip (the first frame index of the next push)."""
        return self._output_frames

    @property
    def closed(self) -> bool:
        return self._closed

    @torch.compiler.disable
    def push(self, z: Tensor) -> Tensor:
        """Decode the clip's next latent frames `z` [batch, z_dim, t, height, width] (t >= 1, the session's
        dtype and device): returns their frames [batch, 3, n, H, W], n = 4 t (1 + 4 (t - 1) for the clip's
        first push). Raises TypeError/ValueError for other input, RuntimeError after `close()`, when the VAE
        was optimized again or un-optimized since the clip started (call `reset()`), or where a whole decode's
        post_quant_conv would differ (see the class)."""
        self._check(z)
        with self._lock:
            if self._closed:
                raise RuntimeError("stream: push on a closed session")
            runner, clip, vae = self._runner, self._clip, self.vae
            if installed_runner(vae) is not runner:
                raise RuntimeError("stream: the VAE was optimized again or un-optimized since this clip started; "
                                   "call reset() to start a new clip")
            _pre_forward(vae)
            rows = clip.rows(z)
            with runner.lock.holding(z.device), CAPTURE_GATE.running():
                frames = clip.frames + z.shape[2]
                if not frame_local_post_quant_conv(vae.post_quant_conv, rows[0].shape[0], frames, z):
                    raise RuntimeError(
                        f"stream: post_quant_conv over a {frames}-frame clip of {tuple(rows[0].shape[3:])} latents "
                        f"({self.dtype} on {self.device}) differs from the per-frame conv a session runs (the conv "
                        "library picks its algorithm by size), so this push cannot give what decoding the whole "
                        "clip gives; decode the whole latent (vae.decode or vae.decode_stream)")
                reason = clip.reason(runner, vae, rows)
                xs = [[vae.post_quant_conv(row[:, :, j : j + 1]) for j in range(z.shape[2])] for row in rows]
                video = clip.decode(runner, vae, xs, reason)
                clip.report(runner)
            video = finish_video(vae, video)
            self._output_frames += video.shape[2]
            return video

    def _check(self, z) -> None:
        if not isinstance(z, Tensor):
            raise TypeError(f"stream: push expects a latent tensor, got {type(z).__name__}")
        z_dim = self._runner.z_dim
        expected = (self.batch, z_dim, self.height, self.width)
        if z.dim() != 5 or (z.shape[0], z.shape[1], z.shape[3], z.shape[4]) != expected or z.shape[2] < 1:
            raise ValueError(f"stream: push expects latents [batch={self.batch}, z_dim={z_dim}, frames >= 1, "
                             f"height={self.height}, width={self.width}]; got {tuple(z.shape)}")
        if z.dtype != self.dtype or z.device != self.device:
            raise ValueError(f"stream: the session decodes {self.dtype} on {self.device}; got {z.dtype} on {z.device}")

    def reset(self) -> None:
        """Start a new clip (its first push decodes chunk 0). Takes the VAE's current optimization, slicing and
        tiling; the previous clip's state is dropped."""
        with self._lock:
            if self._closed:
                raise RuntimeError("stream: reset of a closed session")
            runner = installed_runner(self.vae)
            if not getattr(runner, "decodes_streams", False):
                raise RuntimeError("stream: the VAE is no longer optimized (call rewrite.optimize first)")
            self._start(runner)

    def close(self) -> None:
        """End the session and drop its state (idempotent). Its caches are freed once no call holds them."""
        with self._lock:
            self._closed, self._clip = True, None

    def __enter__(self) -> StreamSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------------------ the conv check

_FRAME_LOCAL: dict[tuple, bool] = {}


def _conv_settings(device: torch.device) -> tuple:
    """The process settings a conv's algorithm choice may depend on."""
    if device.type == "cuda":
        cudnn = torch.backends.cudnn
        return (cudnn.enabled, cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32,
                torch.are_deterministic_algorithms_enabled(), device.index)
    return (torch.backends.mkldnn.enabled, torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())


def frame_local_post_quant_conv(conv: nn.Module, batch: int, frames: int, like: Tensor) -> bool:
    """Whether `conv` (Wan's post_quant_conv, a 1x1x1 causal conv) over a `frames`-frame clip of `like`'s
    spatial size, dtype and device gives every frame bit for bit what it gives that frame alone.

    Checked on seeded random latents ([batch, C, frames, h, w], each frame against the conv of its one-frame
    slice), through the conv's class forward (its hooks do not see the check), and cached per process by
    weight shape, batch, size, clip length, dtype, device and the backend settings the algorithm choice may
    depend on. Evidence for these shapes, as the conv self-checks of `rewrite.ops.selftest` are: a kernel
    whose order depended on the values would escape it. Not run inside a CUDA graph capture (RuntimeError
    when the verdict is not cached yet)."""
    _, _, _, height, width = like.shape
    key = (tuple(conv.weight.shape), conv.bias is not None, conv.weight.dtype, batch, frames, height, width,
           like.dtype, like.device, _conv_settings(like.device))
    verdict = _FRAME_LOCAL.get(key)
    if verdict is None:
        if like.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("stream: the post_quant_conv check cannot run inside a CUDA graph capture")
        generator = torch.Generator().manual_seed(frames)
        z = torch.randn((batch, conv.in_channels, frames, height, width), generator=generator).to(like.device, like.dtype)
        forward = type(conv).forward
        with torch.no_grad():
            whole = forward(conv, z)
            verdict = all(torch.equal(whole[:, :, i : i + 1], forward(conv, z[:, :, i : i + 1])) for i in range(frames))
        verdict = _FRAME_LOCAL.setdefault(key, verdict)
    return verdict


__all__ = ["ClipState", "StreamSession", "decode_stream", "frame_local_post_quant_conv"]
