"""rewrite/models/wan."""
