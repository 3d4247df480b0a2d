"""``grain._src.core.transforms``: grain's private path, re-exported from grainlike."""

from grainlike.transforms import Batch, Filter, Map, MapWithIndex, RandomMap

__all__ = ['Batch', 'Filter', 'Map', 'MapWithIndex', 'RandomMap']
