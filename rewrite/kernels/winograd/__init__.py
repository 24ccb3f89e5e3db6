"""rewrite/kernels/winograd: Winograd F(2x2, 3x3) convolutions (level channels_last)."""
