"""rewrite/models."""
