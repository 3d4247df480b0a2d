from grainlike.experimental import WindowShuffleIterDataset, WindowShuffleMapDataset
from grainlike.dataset.transformations.shuffle import ShuffleMapDataset

__all__ = ['ShuffleMapDataset', 'WindowShuffleIterDataset', 'WindowShuffleMapDataset']
