"""Guard predicates that several pattern families share (one definition, imported by each family).

A guard takes a `rewrite.engine.matcher.Match` and returns None when the match may be replaced, else the
reason it may not.
"""

from __future__ import annotations

from rewrite.kernels import cards, layout
from rewrite.ops import dispatch  # INTERPRETING, conv_bias_is_separate (looked up per call: tests patch them)


def triton_kernel_runs(device, kernel: str) -> str | None:
    """None where a family's Triton `kernel` runs and its per-shape choice tables serve: a graph on a CUDA card
    they were measured on (`rewrite.kernels.cards`), or on the CPU under the Triton interpreter (the tests);
    else the reason, naming the kernel."""
    if device.type == "cuda":
        return cards.unmeasured_card_reason(device)
    if dispatch.INTERPRETING and device.type == "cpu":
        return None
    return f"the graph runs on {device}: {kernel} runs on CUDA"


def conv_bias_deferrable(match, weight: str = "weight", bias: str = "bias") -> str | None:
    """The conv of the match's (`weight`, `bias`) inputs may have its bias deferred into a later kernel: the
    graph runs where ATen's conv adds its bias with a separate `add_` (a CUDA graph,
    `dispatch.conv_bias_is_separate`), and the bias holds one value per output channel."""
    device = match.inputs[weight].meta["val"].device
    if not dispatch.conv_bias_is_separate(device):
        return f"the graph runs on {device}, where ATen's conv may fold its bias into the sum"
    bias_val = match.inputs[bias].meta["val"]
    channels = match.inputs[weight].meta["val"].shape[0]
    if bias_val.dim() != 1 or bias_val.shape[0] != channels:
        return f"bias {list(bias_val.shape)} is not one value per output channel ({channels})"
    return None


def triton_causal_conv_guard(conv_reason, kernel: str):
    """The guard of a Wan causal conv family whose op runs the Triton `kernel`: None where the kernel may run
    (`triton_kernel_runs`) on a 5-D x with a causal pad of six non-negative entries and
    ``conv_reason(padded input shape, weight shape, dtype, device)`` accepts the conv; else the reason. The match
    has inputs x, weight and an optional cache, scalars pad and mode."""

    def guard(match) -> str | None:
        x = match.inputs["x"].meta["val"]
        reason = triton_kernel_runs(x.device, kernel)
        if reason is not None:
            return reason
        cache = match.inputs.get("cache")
        pad = list(match.scalars["pad"])
        if x.dim() != 5 or len(pad) != 6 or min(pad) < 0:
            return f"not a causal conv3d of a 5-D input: x {tuple(x.shape)}, pad {pad}"
        cache_val = None if cache is None else cache.meta["val"]
        in_shape = layout.padded_shape(x.shape, cache_val, pad, match.scalars["mode"])
        return conv_reason(in_shape, tuple(match.inputs["weight"].meta["val"].shape), x.dtype, x.device)

    return guard
