"""``grain._src.python.dataset.transformations.shuffle``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import WindowShuffleIterDataset, WindowShuffleMapDataset
from grainlike.dataset.shuffle import ShuffleMapDataset

__all__ = ['ShuffleMapDataset', 'WindowShuffleIterDataset', 'WindowShuffleMapDataset']
