"""rewrite/kernels/epilogue."""
