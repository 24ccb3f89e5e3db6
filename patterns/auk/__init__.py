"""patterns/auk."""
