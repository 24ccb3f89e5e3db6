"""rewrite/capture."""
