"""``grain._src.python.experimental.device_put``."""
