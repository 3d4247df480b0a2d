"""``grain._src.python.dataset.dataset``: grain's private path, re-exported from grainlike."""

from grainlike import MapDataset, IterDataset, DatasetIterator
from grainlike.experimental import apply_transformations, WithOptionsIterDataset

__all__ = ['DatasetIterator', 'IterDataset', 'MapDataset', 'WithOptionsIterDataset', 'apply_transformations']
