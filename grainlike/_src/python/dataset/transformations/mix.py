from grainlike.dataset.mix import ConcatenateMapDataset, MixedIterDataset, MixedMapDataset

__all__ = ['ConcatenateMapDataset', 'MixedIterDataset', 'MixedMapDataset']
