from grainlike.experimental import FirstFitPackIterDataset
from grainlike.dataset.packing import BestFitPackIterDataset, PackIterDataset, PackingDatasetIterator

__all__ = ['BestFitPackIterDataset', 'FirstFitPackIterDataset', 'PackIterDataset', 'PackingDatasetIterator']
