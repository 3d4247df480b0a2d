from grainlike.transforms import Batch, Filter, Map, MapWithIndex, RandomMap
from grainlike.core.transforms import FlatMap, TfRandomMap, Transformation, Transformations, get_pretty_transform_name

__all__ = ['Batch', 'Filter', 'FlatMap', 'Map', 'MapWithIndex', 'RandomMap', 'TfRandomMap', 'Transformation',
           'Transformations', 'get_pretty_transform_name']
