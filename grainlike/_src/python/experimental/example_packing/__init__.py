"""``grain._src.python.experimental.example_packing``."""
