"""``grain._src.python.dataset.transformations.flatmap``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import FlatMapIterDataset, FlatMapMapDataset

__all__ = ['FlatMapIterDataset', 'FlatMapMapDataset']
