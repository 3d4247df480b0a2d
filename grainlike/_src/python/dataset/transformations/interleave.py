"""``grain._src.python.dataset.transformations.interleave``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import InterleaveIterDataset

__all__ = ['InterleaveIterDataset']
