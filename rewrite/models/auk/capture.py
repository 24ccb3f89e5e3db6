"""Capture the AuK decode (`AuKVAE.decode` without its input check) as one graph per (dtype, device).

The captured function is the whole decode of a window of *normalised* latents::

    decode(z [B, frames, latent_dim]) -> wave [B, frames * hop]
      raw = z * global_log_std.sqrt() + global_mean      (the same ops as AuKVAE.decode: exact)
      decoder(raw.transpose(1, 2)).squeeze(1)           (conv_pre ... conv_post, clamp(-1, 1))

It starts at the latent normalisation rather than at raw latents so that a driver which pads a window to
a bucket with `AuKVAE.pad_latent()` (the normalised latent that denormalises to raw zero) feeds the graph
exactly what `AuKVAE.decode` would see, and so that one graph is one decode. The decoder has no state, so
unlike Wan there is no step/cache protocol: the step module just calls the unmodified modules.

Exported with `export_step` (`torch.export.export(strict=False)`, pre-dispatch ATen, no decompositions)
with batch and frames marked `Dim.AUTO`: both stay symbolic (export reports the range [2, inf) for each,
its 0/1 specialisation, but the graph holds no guard and no shape-specific op, so one capture serves
every batch and every length, 1 included; the tests check batch 1 and 2 and several lengths against
eager). The transposed convs' crop `y[..., :L * stride]` becomes a slice ending at a SymInt product of the
frame count. Parameters and buffers (the latent statistics and every activation's `taps`) are graph
inputs read from the live `AuKVAE` by name (`CapturedGraph.weights(vae)`).

Each `AliasFreeSnakeBeta` call is recorded as one ``rewrite::alias_free_snake_module`` node (the op runs
the module's ATen calls, so it is exact) instead of its 15 ATen ops: those ops' symbolic shapes were about
two thirds of the export time (full decoder: 9.1 -> 2.7 s on a 2-core CPU, stack traces off too). The
``alias_free_activation`` patterns replace the node per level. ``activations_as_ops=False`` records the
ATen ops instead (the patterns match that form too; tests compare the two).
"""

from __future__ import annotations

import contextlib
import types
from typing import Iterator

import torch
from torch import nn

from rewrite.capture.export import CapturedGraph, export_step, tracing_copy

#: latent dims that stay symbolic: batch and frames (the latent size is the model's)
DYNAMIC_DIMS = (0, 1)
#: example window used for export (fake tensors; distinct values avoid accidental equalities)
EXAMPLE_BATCH, EXAMPLE_FRAMES = 2, 7
GRAPH_NAME = "decode"


def _vae_class():
    from rewrite.models.auk.model import AuKVAE

    return AuKVAE


def is_auk(module: nn.Module) -> bool:
    return isinstance(module, _vae_class())


def reference_decode(vae: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """The class's own decode (bypasses the instance-level `decode` that `optimize` installs)."""
    return _vae_class().decode(vae, z)


class AuKDecodeStep(nn.Module):
    """`z -> wave`: `AuKVAE.decode` after its latent check, calling the unmodified modules.

    Holds the VAE's own decoder and latent-statistics buffers under the VAE's names (not the VAE itself:
    its `decode` may be the instance method `optimize` installs), so that parameter names and the
    `nn_module_stack` paths in the graph (`decoder.resblocks.0...`) name the `AuKVAE`'s modules.
    """

    def __init__(self, vae: nn.Module):
        super().__init__()
        self.decoder = vae.decoder
        self.register_buffer("global_mean", vae.global_mean)
        self.register_buffer("global_log_std", vae.global_log_std)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        raw = z * self.global_log_std.sqrt() + self.global_mean
        return self.decoder(raw.transpose(1, 2)).squeeze(1)


def _activation_as_op(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`AliasFreeSnakeBeta.forward` as one ``rewrite::alias_free_snake_module`` call (the same ATen calls)."""
    from rewrite.models.auk import ops as _ops  # noqa: F401  (registers the op)

    return torch.ops.rewrite.alias_free_snake_module.default(x, module.act.alpha, module.act.beta, module.taps,
                                                              module.act.logscale)


@contextlib.contextmanager
def activation_modules_as_ops(vae: nn.Module) -> Iterator[None]:
    """While inside, every `AliasFreeSnakeBeta` of ``vae.decoder`` calls the op (an instance ``forward``,
    removed on exit). A module that already has an instance ``forward`` keeps it (the decode guards then
    refuse the graph anyway)."""
    from rewrite.models.auk.model import AliasFreeSnakeBeta

    patched = [m for m in vae.decoder.modules() if isinstance(m, AliasFreeSnakeBeta) and "forward" not in m.__dict__]
    try:
        for module in patched:
            module.forward = types.MethodType(_activation_as_op, module)
        yield
    finally:
        for module in patched:
            module.__dict__.pop("forward", None)


def capture_auk_decode(vae: nn.Module, dtype: torch.dtype, device: torch.device,
                       activations_as_ops: bool = True) -> CapturedGraph:
    """Export the decode graph of an `AuKVAE` for one dtype and device (batch and frames dynamic).

    No real computation happens (export runs on fake tensors), so `vae` may live on the meta device.
    ``activations_as_ops``: record each alias-free activation as one op node (the default; see above).
    What is traced is a `tracing_copy` of `vae` (eval mode, same tensors): the live module is never touched.
    """
    vae = tracing_copy(vae)
    z = torch.zeros(EXAMPLE_BATCH, EXAMPLE_FRAMES, vae.config.latent_dim, dtype=dtype, device=device)
    with activation_modules_as_ops(vae) if activations_as_ops else contextlib.nullcontext():
        return export_step(GRAPH_NAME, AuKDecodeStep(vae), (z,), dynamic_dims=DYNAMIC_DIMS)
