"""Decode driver for an optimized `AuKVAE`: one captured decode graph per (dtype, device).

`AuKRunner.install(vae)` sets two instance attributes and nothing else (no parameter, buffer or submodule
changes, so `state_dict()` is untouched):
  * `vae.decode`: the model's own latent check (its ValueError), the guards, then `run_window(z)`;
    `AuKVAE.forward` calls `self.decode`, so `vae(z)` takes the same route;
  * `vae._rewrite_runner`: this runner (read by `report`).
`AuKRunner.uninstall(vae)` removes both. When a guard objects (autograd, hooks or instance `forward`
wrappers inside the decoder, global module hooks, mixed parameter/buffer dtypes or devices, latents unlike
the parameters, another CUDA graph capture in progress, a failed capture), the call runs the class's own
`AuKVAE.decode` and the reason is logged once and counted in the report.

Seam for the windowed / CUDA-graph runtime (`rewrite/runtime/graphs.py`, next issue): `run_window(z)` is
the whole eager graph path for one window of normalised latents `[B, frames, latent_dim]` (batch and
frames are dynamic in the captured graph: any window length works, e.g. a bucket padded with
`vae.pad_latent()`), and `graph_for(dtype, device)` returns the captured graph itself, whose
`weights(vae)` are the parameter and buffer tensors to keep static. A driver calls `fallback_reason(z)`
once per decode, then `run_window` per window (or its own replay of the same graph).
"""

from __future__ import annotations

import types

import torch
from torch import nn

from rewrite.capture.auk import capture_auk_decode, reference_decode
from rewrite.capture.export import CapturedGraph
from rewrite.report import FallbackLog, GraphReport
from rewrite.runtime import guards
from rewrite.runtime.captures import CaptureCache


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


class AuKRunner:
    """The captured decode graph per (dtype, device) of one `AuKVAE`, and the code that runs it."""

    model_name = "auk"

    def __init__(self, vae: nn.Module, level: str, rewrite_graph) -> None:
        self.level = level
        self.rewrite_graph = rewrite_graph  # fn(CapturedGraph, level) applying the level's passes in place
        self.graphs: CaptureCache[CapturedGraph] = CaptureCache()  # per (dtype, device)
        self.fallbacks = FallbackLog()
        # A plain reference (a cycle through vae._rewrite_runner, which the GC collects): copy.deepcopy of
        # the VAE then gives the copy a runner bound to the copy, as for the Wan runner's bound methods.
        self.vae = vae

    # ---- installation -------------------------------------------------------------------------------
    def install(self, vae: nn.Module) -> None:
        self.vae = vae
        vae._rewrite_runner = self
        vae.decode = types.MethodType(_optimized_decode, vae)

    @staticmethod
    def uninstall(vae: nn.Module) -> None:
        for name in ("decode", "_rewrite_runner"):
            vae.__dict__.pop(name, None)

    # ---- capture ------------------------------------------------------------------------------------
    def graph_for(self, dtype: torch.dtype, device: torch.device) -> CapturedGraph | None:
        """The rewritten decode graph for this dtype/device, captured on first use; None if capture failed."""
        def capture():
            graph = capture_auk_decode(self.vae, dtype, device)
            self.rewrite_graph(graph, self.level)
            return graph

        return self.graphs.get((dtype, device), capture, f"{dtype} on {device}")

    def graph_reports(self) -> list[GraphReport]:
        return [GraphReport.of(g) for g in self.graphs.values.values()]

    # ---- decode -------------------------------------------------------------------------------------
    def fallback_reason(self, z: torch.Tensor) -> str | None:
        """Why this call cannot run through the graph, or None (captures on first use)."""
        vae = self.vae
        reason = (
            guards.autograd_reason(vae, z)
            or guards.hook_reason(vae.decoder, "decoder")
            or uniform_tensors_reason(vae, z)
            or guards.capture_in_progress_reason(z.device)
        )
        if reason is None and self.graph_for(z.dtype, z.device) is None:
            reason = self.graphs.errors[(z.dtype, z.device)]
        return reason

    def run_window(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised latents `[B, frames, latent_dim]` -> waveform `[B, frames * hop]` through the graph.

        No checks: the caller has validated the latents and `fallback_reason(z)` returned None.
        """
        graph = self.graphs[(z.dtype, z.device)]
        (wave,) = graph(graph.weights(self.vae), z)
        return wave

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """`AuKVAE.decode` through the graph, or through the reference when a guard objects."""
        vae = self.vae
        vae._check_latents(z)  # the model's own ValueError for bad latents
        reason = self.fallback_reason(z)
        if reason is not None:
            self.fallbacks.took_reference(reason)
            return reference_decode(vae, z)
        wave = self.run_window(z)
        self.fallbacks.took_graphs()
        return wave


def _optimized_decode(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Replacement for `AuKVAE.decode` (bound to the instance by `AuKRunner.install`)."""
    return vae._rewrite_runner.decode(z)
