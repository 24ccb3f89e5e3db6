"""The AuK decoder's fusion patterns, one module per family; `PATTERN_MODULES` is their matching order within
this folder."""

# Modules of this folder whose PATTERNS the registry collects, in matching order.
PATTERN_MODULES: tuple[str, ...] = (
    # alias_free lists its channels_last [fused] pattern before the lossless [exact] one (same search)
    "alias_free", "causal_conv1d", "causal_conv_transpose1d", "amp_average",
    # after the two families it combines (channels_last only)
    "snake_conv",
    # after snake_conv, whose fused ops it chains
    "deferred_bias",
)
