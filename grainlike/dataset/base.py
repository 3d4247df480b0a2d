"""The Dataset API's three classes and the stage protocol they share.

* ``MapDataset``: random access. ``len(ds)`` is one epoch; ``ds[i]`` is the element
  at ``i`` (any ``i >= 0``: indices past the end wrap into later epochs), ``None``
  for an element a filter removed; ``ds._getitems(indices)`` reads many at once,
  which is the path iteration takes.
* ``IterDataset``: iterable only; ``iter(ds)`` builds a ``DatasetIterator``.
* ``DatasetIterator``: the iterator stage. Its state is a small JSON-able dict of
  indices that each stage nests or forwards, so a restore is exact and cheap.

Every transformation is a stage in its own module (``map.py``, ``shuffle.py``, ...);
the methods here only build them. Names, arguments, outputs, random draws and state
dicts are those of grain 0.2.18's Dataset API.

This module is the import path of grain's ``base`` names and of the three classes;
they are defined in ``map_dataset.py``, ``iter_dataset.py``, ``iterator.py`` and
``dataset_node.py``.
"""

from grainlike.dataset.iter_dataset import IterDataset, IterDatasetMeta
from grainlike.dataset.iterator import (
    DatasetIterator,
    IteratorContext,
    MultiprocessingContext,
    get_next_index,
    set_next_index,
)
from grainlike.dataset.map_dataset import DatasetSelectionMap, MapDataset, MapDatasetMeta, apply_transformations

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
