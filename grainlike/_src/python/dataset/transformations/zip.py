"""``grain._src.python.dataset.transformations.zip``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import ZipIterDataset, ZipMapDataset

__all__ = ['ZipIterDataset', 'ZipMapDataset']
