"""``grain._src.python.data_loader``: grain's private path, re-exported from grainlike."""

from grainlike import DataLoader, DataLoaderIterator

__all__ = ['DataLoader', 'DataLoaderIterator']
