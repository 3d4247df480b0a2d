"""``grain._src.python.dataset.transformations.cache``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.cache import CacheIterDataset

__all__ = ['CacheIterDataset']
