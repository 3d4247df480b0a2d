"""``grain._src.python.dataset.transformations.packing``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import FirstFitPackIterDataset

__all__ = ['FirstFitPackIterDataset']
