"""Fusion patterns, one module per family (installed as ``rewrite.patterns``).

Each module listed in ``PATTERN_MODULES`` defines ``PATTERNS``: a tuple of ``rewrite.engine.pattern.Pattern``
(usually from ``variants(...)``), with its replacement, guard, exactness class and minimum level in the
module docstring. ``registry()`` collects them in the order listed; pattern names must be unique.
"""

from __future__ import annotations

import importlib

from rewrite.engine.pattern import Pattern

# Module names (files in this package's family folders) whose PATTERNS the registry collects, in matching order.
PATTERN_MODULES: tuple[str, ...] = (
    "wan.rms_norm", "wan.causal_conv_input", "wan.conv_residual", "wan.upsample_nearest", "wan.temporal_interleave", "wan.dup_up_add",
    # after the families they combine
    "wan.causal_conv3d", "wan.upsample_conv2d",
    # after causal_conv3d, whose op it feeds
    "wan.rms_norm_causal_conv3d",
    # after upsample_conv2d and dup_up_add, which it chains
    "wan.upsample_conv2d_dup_up_add",
    # after upsample_conv2d_dup_up_add, which keeps the upsample convs it chains (channels_last only)
    "wan.upsample_conv2d_fast",
    # after upsample_conv2d_dup_up_add, whose op it replaces (channels_last only)
    "wan.upsample_conv2d_dup_up_add_fast",
    # the middle block's attention (channels_last only)
    "wan.attention_fast",
    # after rms_norm_causal_conv3d, the op its guard wants as the only kind of user
    "wan.pointwise_conv3d",
    # after the two ops they chain (residual_bias first: norm_input_bias matches its result too)
    "wan.residual_bias", "wan.norm_input_bias",
    # after every family that builds or rewires rms_norm_causal_conv3d (channels_last only)
    "wan.rms_norm_causal_conv3d_fast",
    # after the fast op, whose chained pairs it fuses (channels_last only)
    "wan.rms_norm_causal_conv3d_pair_fast",
    # AuK: auk_alias_free lists its channels_last [fused] pattern before the lossless [exact] one (same search)
    "auk.alias_free", "auk.causal_conv1d", "auk.causal_conv_transpose1d", "auk.amp_average",
    # after the two families it combines (channels_last only)
    "auk.snake_conv",
    # after snake_conv, whose fused ops it chains
    "auk.deferred_bias",
)


def registry() -> tuple[Pattern, ...]:
    """Every registered pattern, in ``PATTERN_MODULES`` order."""
    patterns: list[Pattern] = []
    for module_name in PATTERN_MODULES:
        module = importlib.import_module(f"{__name__}.{module_name}")
        patterns.extend(module.PATTERNS)
    names = [p.name for p in patterns]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate pattern names in the registry: {duplicates}")
    return tuple(patterns)
