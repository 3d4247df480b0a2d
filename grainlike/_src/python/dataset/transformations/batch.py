"""``grain._src.python.dataset.transformations.batch``: grain's private path, re-exported from grainlike."""

from grainlike.dataset.batch import BatchIterDataset, BatchMapDataset, batch_and_pad

__all__ = ['BatchIterDataset', 'BatchMapDataset', 'batch_and_pad']
