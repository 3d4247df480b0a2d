"""``grain._src.python.options``: grain's private path, re-exported from grainlike."""

from grainlike import MultiprocessingOptions, ReadOptions

__all__ = ['MultiprocessingOptions', 'ReadOptions']
