"""``grain._src.python.dataset.transformations.map``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import RngPool

__all__ = ['RngPool']
