"""``grain._src.python.checkpoint``."""
