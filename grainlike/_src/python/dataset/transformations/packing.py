"""``grain._src.python.dataset.transformations.packing``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import FirstFitPackIterDataset
from grainlike.dataset.packing import BestFitPackIterDataset, PackingDatasetIterator

__all__ = ['BestFitPackIterDataset', 'FirstFitPackIterDataset', 'PackingDatasetIterator']
