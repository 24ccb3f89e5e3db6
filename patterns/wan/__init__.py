"""Wan's fusion patterns (Wan 2.1 / 2.2 decoders, and the model families whose graphs are Wan's), one module
per family; `PATTERN_MODULES` is their matching order within this folder."""

# Modules of this folder whose PATTERNS the registry collects, in matching order.
PATTERN_MODULES: tuple[str, ...] = (
    "rms_norm", "causal_conv_input", "conv_residual", "upsample_nearest", "temporal_interleave", "dup_up_add",
    # after the families they combine
    "causal_conv3d", "upsample_conv2d",
    # the encoder's downsamplers
    "pad_conv2d", "time_conv",
    # Wan 2.2's down-block ends (channels_last only)
    "avg_down_add",
    # after causal_conv3d, whose op it feeds
    "rms_norm_causal_conv3d",
    # after upsample_conv2d and dup_up_add, which it chains
    "upsample_conv2d_dup_up_add",
    # after upsample_conv2d_dup_up_add, which keeps the upsample convs it chains (channels_last only)
    "upsample_conv2d_fast",
    # after upsample_conv2d_dup_up_add, whose op it replaces (channels_last only)
    "upsample_conv2d_dup_up_add_fast",
    # the middle block's attention (channels_last only)
    "attention_fast",
    # after rms_norm_causal_conv3d, the op its guard wants as the only kind of user
    "pointwise_conv3d",
    # after the two ops they chain (residual_bias first: norm_input_bias matches its result too)
    "residual_bias", "norm_input_bias",
    # after every family that builds or rewires rms_norm_causal_conv3d (channels_last only)
    "rms_norm_causal_conv3d_fast",
    # after the fast op, whose chained pairs it fuses (channels_last only)
    "rms_norm_causal_conv3d_pair_fast",
    # the causal convs no norm feeds, of a narrow input (the encoder's first; channels_last only)
    "causal_conv3d_fast",
)
