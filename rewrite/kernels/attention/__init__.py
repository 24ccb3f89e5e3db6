"""rewrite/kernels/attention."""
