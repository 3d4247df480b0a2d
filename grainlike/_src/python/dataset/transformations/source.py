"""``grain._src.python.dataset.transformations.source``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.source import RangeMapDataset, SourceMapDataset

__all__ = ['RangeMapDataset', 'SourceMapDataset']
