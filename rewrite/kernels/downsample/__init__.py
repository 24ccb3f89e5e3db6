"""rewrite/kernels/downsample."""
