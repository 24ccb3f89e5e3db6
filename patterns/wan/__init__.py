"""patterns/wan."""
