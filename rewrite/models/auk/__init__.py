"""rewrite/models/auk."""
