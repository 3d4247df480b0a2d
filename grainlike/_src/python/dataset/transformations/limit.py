from grainlike.experimental import LimitIterDataset

__all__ = ['LimitIterDataset']
