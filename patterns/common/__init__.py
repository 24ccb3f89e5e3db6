"""patterns/common."""
