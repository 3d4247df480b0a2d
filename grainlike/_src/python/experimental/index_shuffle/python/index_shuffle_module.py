"""``grain._src.python.experimental.index_shuffle.python.index_shuffle_module``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import index_shuffle

__all__ = ['index_shuffle']
