"""``grain._src.python.ipc``."""
