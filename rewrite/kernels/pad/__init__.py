"""rewrite/kernels/pad."""
