"""``grain._src.python.dataset.transformations``."""
