"""grain's Dataset API: ``MapDataset``, ``IterDataset`` and ``DatasetIterator``.

Each transformation is one stage module (``map``, ``filter``, ``batch``, ``shuffle``,
``repeat``, ``slice``, ``mix``, ``prefetch``, ...) speaking the protocol of ``base``.
"""

from grainlike.dataset.base import (
    DatasetIterator,
    DatasetSelectionMap,
    IterDataset,
    MapDataset,
    apply_transformations,
    get_next_index,
    set_next_index,
)

__all__ = [
    "DatasetIterator",
    "DatasetSelectionMap",
    "IterDataset",
    "MapDataset",
    "apply_transformations",
    "get_next_index",
    "set_next_index",
]
