"""The GPUs whose per-shape kernel choices were measured, and the safe choice on every other card.

The `channels_last` tables that pick our Triton kernels over cuDNN's or ATen's per shape (the conv3d's
`_FASTER_THAN_CUDNN` and `_NORM_EPILOGUE_FASTER`, the Wan ops' one-pass norm, chain and upsample tables, the
attention head dims; AuK's `_CUDNN_FASTER_UNDILATED` conv1d table) were measured on the H200
(docs/tuning.md). Which kernel wins depends on the card (SM count, clocks, power cap, memory bandwidth), so
those tables serve only the cards listed here; on any other CUDA card the Wan patterns that would use them
decline, and the graph keeps the `lossless` ops and cuDNN's convs, and AuK's fused activation keeps cuDNN's
conv after it (`rewrite.kernels.conv1d.conv1d.chosen`): slower than a measured table could make it, never a
guess. A card is added after its own sweep
(`python -m rewrite.tools.sweep_conv3d` and the other `tools/sweep_*` scripts), one line here.
"""

from __future__ import annotations

import torch

#: card name, as `torch.cuda.get_device_name` gives it -> where its kernel choices come from
MEASURED_CARDS: dict[str, str] = {
    "NVIDIA H200": "the H200 sweeps (docs/tuning.md)",
    # its own sweeps agree with the H200's choices for the Wan 2.1 / 2.2 convs of the 480p and 720p steps but
    # one (docs/tuning.md 1.20); what it measured otherwise is in `conv3d.CARD_TILES`, `CARD_FASTER_THAN_CUDNN`
    # (the encoders' convs) and `CARD_CUDNN_FASTER` (docs/tuning.md 1.21)
    "NVIDIA H100 80GB HBM3": "the H200's tables, checked by its own sweeps (docs/tuning.md 1.20)",
}


def name(device: torch.device) -> str | None:
    """The card's name as `torch.cuda.get_device_name` gives it, None off CUDA."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def unmeasured_card_reason(device: torch.device) -> str | None:
    """None where the per-shape kernel choices serve `device` (a listed card, or no CUDA device: the CPU runs
    the kernels only under the Triton interpreter, in tests); else why the safe choice is taken."""
    card = name(device)
    if card is None or card in MEASURED_CARDS:
        return None
    return (f"no kernel choices were measured on {card} (measured: {', '.join(MEASURED_CARDS)}): the lossless "
            "ops and cuDNN's convs, the safe choice")
