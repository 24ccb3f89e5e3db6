"""rewrite/kernels/norm."""
