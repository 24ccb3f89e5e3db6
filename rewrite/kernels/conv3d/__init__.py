"""rewrite/kernels/conv3d."""
