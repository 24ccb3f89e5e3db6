"""Capture the diffusers Wan 2.1 / 2.2 decoder (`AutoencoderKLWan.decoder`) as two step graphs (and the decoders
of families made of the same blocks under other class names, `DECODER_FAMILIES`).

The unmodified diffusers decoder keeps its temporal cache in a Python list mutated in place (slots hold
None, a tensor, or the string "Rep"), so it cannot be traced as a whole. It is wrapped instead as two step
functions with explicit state, exported with `torch.export.export(strict=False)`:

  chunk0(x)              -> (y, *caches)   first latent frame (`first_chunk=True`, empty cache)
  steady(x, *caches)     -> (y, *caches)   every later latent frame

Chunk 0 emits its caches already in *steady form*, so that one steady graph serves chunk 1 and all later
chunks (the reference has three phases):
  * a 1-frame cache `c` becomes `cat([zeros_like(c), c])`: the causal conv of the next chunk then
    concatenates two cached frames instead of one cached frame plus one zero pad frame (same values);
  * a temporal upsampler's "Rep" marker becomes a zero 2-frame cache of that upsampler's input: its
    `time_conv` then concatenates two zero frames instead of zero-padding two frames (same values).
The convolutions therefore see bit-identical inputs. 1x1x1 shortcut convs take no slot.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn

from rewrite.capture.export import CapturedGraph, concrete_shape, export_step, tracing_copy

#: latent dims that stay symbolic in the exported graphs: batch, height, width (frames are one per step)
DYNAMIC_DIMS = (0, 3, 4)
#: example latent size used for export (no real compute happens; distinct values avoid accidental equalities)
EXAMPLE_BATCH, EXAMPLE_HEIGHT, EXAMPLE_WIDTH = 2, 3, 5


#: the diffusers modules whose decoders these step functions drive, each with its classes' name prefix; a family
#: whose decoder is Wan's blocks under other class names adds its own (`add_decoder_family`)
DECODER_FAMILIES = {"diffusers.models.autoencoders.autoencoder_kl_wan": "Wan"}


def add_decoder_family(module_name: str, prefix: str) -> None:
    """Let these step functions drive the decoder defined in `module_name`, whose classes are Wan's with `prefix`
    for "Wan" (`{prefix}Decoder3d`, `{prefix}Resample`, `{prefix}CausalConv3d`, ...)."""
    DECODER_FAMILIES[module_name] = prefix


def family_class(module: nn.Module, role: str) -> type:
    """The diffusers class `role` ("Decoder3d", "Encoder3d", "Resample", "CausalConv3d") of the family of
    `module`, a decoder or an encoder of it, read from the module that defines its class (or the first base class
    of `DECODER_FAMILIES`)."""
    import sys

    for cls in type(module).__mro__:
        prefix = DECODER_FAMILIES.get(cls.__module__)
        if prefix is not None and cls.__name__ in (f"{prefix}Decoder3d", f"{prefix}Encoder3d"):
            return getattr(sys.modules[cls.__module__], f"{prefix}{role}")
    raise TypeError(f"not a Wan-family decoder or encoder: {type(module).__qualname__}")


def _temporal_upsamplers(decoder: nn.Module) -> list[nn.Module]:
    resample = family_class(decoder, "Resample")
    return [m for m in decoder.modules() if isinstance(m, resample) and m.mode == "upsample3d"]


def reference_forward(decoder: nn.Module, x: torch.Tensor, feat_cache=None, feat_idx=None, first_chunk=False):
    """The class's own forward (bypasses any instance-level `forward` that `optimize` installs). Qwen-Image's
    decoder takes no `first_chunk` (it has no residual up blocks, the only blocks that read it)."""
    forward = family_class(decoder, "Decoder3d").forward
    if _takes_first_chunk(forward):
        return forward(decoder, x, feat_cache=feat_cache, feat_idx=feat_idx or [0], first_chunk=first_chunk)
    return forward(decoder, x, feat_cache=feat_cache, feat_idx=feat_idx or [0])


@functools.cache
def _takes_first_chunk(forward) -> bool:
    return "first_chunk" in inspect.signature(forward).parameters


def cache_slot_count(module: nn.Module) -> int:
    """Upper bound for the slots a decoder or encoder uses: one per causal conv, as diffusers' `clear_cache`
    sizes its lists (the real count comes from capture: 1x1x1 shortcuts leave theirs empty)."""
    causal_conv = family_class(module, "CausalConv3d")
    return sum(isinstance(m, causal_conv) for m in module.modules())


class WanChunk0Step(nn.Module):
    """`x -> (y, *steady_caches)` for the first latent frame of a clip."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder

    def forward(self, x: torch.Tensor):
        slots: list = [None] * cache_slot_count(self.decoder)
        index = [0]
        upsampler_inputs: list[torch.Tensor] = []
        handles = [
            m.register_forward_pre_hook(lambda _m, args: upsampler_inputs.append(args[0]))
            for m in _temporal_upsamplers(self.decoder)
        ]
        try:
            y = reference_forward(self.decoder, x, feat_cache=slots, feat_idx=index, first_chunk=True)
        finally:
            for h in handles:
                h.remove()
        pending_upsampler_inputs = iter(upsampler_inputs)
        caches = []
        for slot in slots[: index[0]]:
            if isinstance(slot, str):  # "Rep": the upsampler saw its first frame; steady form is a zero cache
                zero = torch.zeros_like(next(pending_upsampler_inputs)[:, :, -1:])
                caches.append(torch.cat([zero, zero], 2))
            elif slot.shape[2] == 1:
                caches.append(torch.cat([torch.zeros_like(slot), slot], 2))
            else:
                caches.append(slot)
        return (y, *caches)


class WanSteadyStep(nn.Module):
    """`(x, caches) -> (y, *caches)` for every latent frame after the first."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder

    def forward(self, x: torch.Tensor, caches: list[torch.Tensor]):
        slots = list(caches)
        index = [0]
        y = reference_forward(self.decoder, x, feat_cache=slots, feat_idx=index, first_chunk=False)
        if index[0] != len(caches):
            raise RuntimeError(f"steady step used {index[0]} cache slots, chunk 0 produced {len(caches)}")
        return (y, *slots[: index[0]])


def capture_wan_decoder(decoder: nn.Module, dtype: torch.dtype, device: torch.device,
                        size: tuple[int, int, int] | None = None) -> tuple[CapturedGraph, CapturedGraph]:
    """Export the chunk-0 and steady step graphs of a `WanDecoder3d` for one dtype and device.

    `size`: None exports graphs with the batch, height and width symbolic (one pair serves every latent
    size); a `(batch, latent_height, latent_width)` triple exports them for that size only, which costs about
    a third of the symbolic export (ATen's shape functions then compute on ints, not on symbols; design.md
    8.6). No real computation happens: export runs on fake tensors; the example inputs of a static export are
    left uninitialized (`torch.empty`: nothing reads them), and the steady graph's example caches are
    allocated from the shapes chunk 0's graph reports. What is traced is a `tracing_copy` of `decoder` (eval
    mode, same tensors): the live decoder is never touched.
    """
    return export_wan_steps(tracing_copy(decoder), dtype, device, size)


def export_wan_steps(traced: nn.Module, dtype: torch.dtype, device: torch.device,
                     size: tuple[int, int, int] | None = None) -> tuple[CapturedGraph, CapturedGraph]:
    """`capture_wan_decoder` on a decoder that is already a `tracing_copy` (exported as it is: the instance
    forwards a caller installed on its modules are traced, e.g. the band forwards of
    `rewrite.models.wan.distributed.band_graphs`). `size` as for `capture_wan_decoder`."""
    decoder = traced
    z_dim = decoder.conv_in.in_channels
    if size is None:
        batch, height, width, make, dims = EXAMPLE_BATCH, EXAMPLE_HEIGHT, EXAMPLE_WIDTH, torch.zeros, DYNAMIC_DIMS
    else:
        (batch, height, width), make, dims = size, torch.empty, ()
    x = make(batch, z_dim, 1, height, width, dtype=dtype, device=device)
    chunk0 = export_step("chunk0", WanChunk0Step(decoder), (x,), dynamic_dims=dims, strip_prefix="decoder.")
    output = next(n for n in chunk0.graph_module.graph.nodes if n.op == "output")
    cache_vals = [node.meta["val"] for node in output.args[0][1:]]
    caches = [make(concrete_shape(v), dtype=v.dtype, device=device) for v in cache_vals]
    steady = export_step("steady", WanSteadyStep(decoder), (x, caches), dynamic_dims=dims, strip_prefix="decoder.")
    return chunk0, steady
