"""``grain._src.core``."""
