"""``grain._src.python.dataset.transformations.packing``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import FirstFitPackIterDataset
from grainlike.dataset.packing import BestFitPackIterDataset, PackIterDataset, PackingDatasetIterator

__all__ = ['BestFitPackIterDataset', 'FirstFitPackIterDataset', 'PackIterDataset', 'PackingDatasetIterator']
