"""rewrite/kernels/alias_free."""
