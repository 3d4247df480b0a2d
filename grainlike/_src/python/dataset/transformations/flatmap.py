from grainlike.experimental import FlatMapIterDataset, FlatMapMapDataset

__all__ = ['FlatMapIterDataset', 'FlatMapMapDataset']
