"""``grain._src.python.testing``."""
