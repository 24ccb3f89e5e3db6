"""rewrite/kernels."""
