from grainlike.dataset.transformations.mix import ConcatenateMapDataset, MixedIterDataset, MixedMapDataset

__all__ = ['ConcatenateMapDataset', 'MixedIterDataset', 'MixedMapDataset']
