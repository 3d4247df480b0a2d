"""``grain._src.python.dataset``."""
