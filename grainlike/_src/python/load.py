"""``grain._src.python.load``: grain's private path, re-exported from grainlike."""

from grainlike import load

__all__ = ['load']
