"""``grain._src.python.dataset.sources``."""
