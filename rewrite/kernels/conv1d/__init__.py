"""rewrite/kernels/conv1d."""
