"""``grain._src.python.dataset.transformations.rebatch``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.rebatch import RebatchIterDataset

__all__ = ['RebatchIterDataset']
