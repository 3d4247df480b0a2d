"""``grain._src.python.dataset.transformations.map``: grain's private path, re-exported from grainlike."""

from grainlike.experimental import RngPool
from grainlike.dataset.map import MapIterDataset, MapMapDataset, MapWithIndexIterDataset, MapWithIndexMapDataset, RandomMapIterDataset, RandomMapMapDataset

__all__ = ['MapIterDataset', 'MapMapDataset', 'MapWithIndexIterDataset', 'MapWithIndexMapDataset', 'RandomMapIterDataset', 'RandomMapMapDataset', 'RngPool']
