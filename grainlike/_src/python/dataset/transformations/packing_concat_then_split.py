from grainlike.experimental import BOSHandling, ConcatThenSplitIterDataset

__all__ = ['BOSHandling', 'ConcatThenSplitIterDataset']
