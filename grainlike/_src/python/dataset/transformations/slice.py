"""``grain._src.python.dataset.transformations.slice``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.slice import SliceMapDataset

__all__ = ['SliceMapDataset']
