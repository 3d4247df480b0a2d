"""``grain._src.python.experimental``."""
