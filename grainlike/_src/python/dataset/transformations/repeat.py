from grainlike.dataset.transformations.repeat import RepeatIterDataset, RepeatMapDataset

__all__ = ['RepeatIterDataset', 'RepeatMapDataset']
