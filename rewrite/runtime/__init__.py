"""rewrite/runtime."""
