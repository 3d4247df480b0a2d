"""``grain._src.python.dataset.transformations.packing_concat_then_split``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import BOSHandling, ConcatThenSplitIterDataset

__all__ = ['BOSHandling', 'ConcatThenSplitIterDataset']
