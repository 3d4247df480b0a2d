from grainlike.dataset.repeat import RepeatIterDataset, RepeatMapDataset

__all__ = ['RepeatIterDataset', 'RepeatMapDataset']
