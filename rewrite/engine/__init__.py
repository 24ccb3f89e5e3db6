"""rewrite/engine."""
