"""``grain._src.python.dataset.transformations.shuffle``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import WindowShuffleIterDataset, WindowShuffleMapDataset

__all__ = ['WindowShuffleIterDataset', 'WindowShuffleMapDataset']
