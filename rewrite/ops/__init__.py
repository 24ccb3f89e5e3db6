"""rewrite/ops."""
