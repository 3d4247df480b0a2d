"""The import path of grain's ``base`` names and of the Dataset API's three classes.

``MapDataset`` (random access), ``IterDataset`` (iterable only) and
``DatasetIterator`` (the iterator stage) are defined in ``map_dataset.py``,
``iter_dataset.py`` and ``iterator.py``.
"""

from grainlike.dataset.nodes.iter_dataset import IterDataset, IterDatasetMeta
from grainlike.dataset.nodes.iterator import (
    DatasetIterator,
    IteratorContext,
    MultiprocessingContext,
    get_next_index,
    set_next_index,
)
from grainlike.dataset.nodes.map_dataset import DatasetSelectionMap, MapDataset, MapDatasetMeta, apply_transformations

__all__ = [
    "DatasetIterator",
    "DatasetSelectionMap",
    "IterDataset",
    "IterDatasetMeta",
    "IteratorContext",
    "MapDataset",
    "MapDatasetMeta",
    "MultiprocessingContext",
    "apply_transformations",
    "get_next_index",
    "set_next_index",
]
