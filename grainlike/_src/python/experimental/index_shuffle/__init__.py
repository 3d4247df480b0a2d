"""``grain._src.python.experimental.index_shuffle``."""
