from grainlike.experimental import WindowShuffleIterDataset, WindowShuffleMapDataset
from grainlike.dataset.shuffle import ShuffleMapDataset

__all__ = ['ShuffleMapDataset', 'WindowShuffleIterDataset', 'WindowShuffleMapDataset']
