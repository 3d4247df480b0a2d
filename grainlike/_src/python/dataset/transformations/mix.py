"""``grain._src.python.dataset.transformations.mix``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.mix import ConcatenateMapDataset, MixedIterDataset, MixedMapDataset

__all__ = ['ConcatenateMapDataset', 'MixedIterDataset', 'MixedMapDataset']
