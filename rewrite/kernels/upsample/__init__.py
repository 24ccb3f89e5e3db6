"""rewrite/kernels/upsample."""
