from grainlike.experimental import RngPool
from grainlike.dataset.transformations.map import MapIterDataset, MapMapDataset, MapWithIndexIterDataset, MapWithIndexMapDataset, RandomMapIterDataset, RandomMapMapDataset

__all__ = ['MapIterDataset', 'MapMapDataset', 'MapWithIndexIterDataset', 'MapWithIndexMapDataset', 'RandomMapIterDataset', 'RandomMapMapDataset', 'RngPool']
