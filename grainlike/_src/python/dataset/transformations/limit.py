"""``grain._src.python.dataset.transformations.limit``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import LimitIterDataset

__all__ = ['LimitIterDataset']
