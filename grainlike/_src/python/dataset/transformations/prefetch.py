"""``grain._src.python.dataset.transformations.prefetch``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import ThreadPrefetchIterDataset

__all__ = ['ThreadPrefetchIterDataset']
