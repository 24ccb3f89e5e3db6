"""The resampling geometry of AuK's alias-free SnakeBeta activation, defined once.

The activation upsamples x2 with a 12-tap Kaiser-windowed sinc (replicate pad, transposed depthwise conv,
crop), applies SnakeBeta, then low-passes causally and decimates x2 with the same taps. These sizes are
fixed by the AuK decoder; the eager module (`rewrite.models.auk.model.AliasFreeSnakeBeta`), the ops that replace
it (`rewrite.models.auk.ops`, `rewrite.models.auk.alias_free`) and the patterns that match it all read them from here.
The taps' values (cutoff, window) belong to the model: the ops take the module's taps buffer.
"""

from torch import Tensor

FILTER_TAPS = 12  # Kaiser-windowed sinc, shared by the upsampler and the low-pass
RESAMPLE_RATIO = 2
# Upsampler: replicate-pad UP_PAD samples each side, transposed conv (stride 2, 12 taps), crop UP_CROP
# each side.  Length: (L + 2*5 - 1) * 2 + 12 - 2*15 = 2L.
UP_PAD = FILTER_TAPS // RESAMPLE_RATIO - 1  # 5
UP_CROP = UP_PAD * RESAMPLE_RATIO + (FILTER_TAPS - RESAMPLE_RATIO) // 2  # 15
# Causal low-pass: replicate-pad 11 on the left only, conv stride 2.  Length: (2L + 11 - 12) // 2 + 1 = L.
DOWN_PAD = FILTER_TAPS - 1  # 11
SNAKE_EPS = 1e-9  # SnakeBeta's 1 / (beta + eps)


def validate(x: Tensor, alpha: Tensor, beta: Tensor, taps: Tensor) -> None:
    """Shape/dtype/device preconditions shared by every implementation (ValueError otherwise)."""
    if x.dim() != 3 or x.shape[-1] < 1:
        raise ValueError(f"alias_free_snake: x must be [B, C, T] with T >= 1, got shape {tuple(x.shape)}")
    channels = x.shape[1]
    for name, t in (("alpha", alpha), ("beta", beta)):
        if t.numel() != channels:
            raise ValueError(f"alias_free_snake: {name} must hold C={channels} values, got shape {tuple(t.shape)}")
    if taps.numel() != FILTER_TAPS:
        raise ValueError(f"alias_free_snake: taps must hold {FILTER_TAPS} values, got shape {tuple(taps.shape)}")
    for name, t in (("alpha", alpha), ("beta", beta), ("taps", taps)):
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(
                f"alias_free_snake: {name} is {t.dtype} on {t.device}, x is {x.dtype} on {x.device} (must match)"
            )
