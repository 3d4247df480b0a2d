"""``grain._src.python``."""
