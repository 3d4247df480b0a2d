"""``grain._src.python.dataset.transformations.repeat``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.repeat import RepeatIterDataset, RepeatMapDataset

__all__ = ['RepeatIterDataset', 'RepeatMapDataset']
