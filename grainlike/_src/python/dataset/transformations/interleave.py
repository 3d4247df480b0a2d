from grainlike.experimental import InterleaveIterDataset

__all__ = ['InterleaveIterDataset']
