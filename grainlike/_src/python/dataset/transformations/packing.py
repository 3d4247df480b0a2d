from grainlike.experimental import FirstFitPackIterDataset
from grainlike.dataset.transformations.packing import BestFitPackIterDataset, PackIterDataset, PackingDatasetIterator

__all__ = ['BestFitPackIterDataset', 'FirstFitPackIterDataset', 'PackIterDataset', 'PackingDatasetIterator']
