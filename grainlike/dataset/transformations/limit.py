"""``LimitIterDataset``: at most ``count`` elements of an IterDataset."""

from __future__ import annotations

from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.transformations.map import _CountingIterator


class _LimitDatasetIterator(_CountingIterator):
    _counter_key = "count_elements_read"

    def __init__(self, parent: DatasetIterator, count: int):
        super().__init__(parent, None, "")
        self._limit = count

    def __next__(self):
        if self._count >= self._limit:
            raise StopIteration
        value = next(self._parent)
        self._count += 1
        return value

    def __str__(self) -> str:
        return f"LimitDatasetIterator(count={self._limit})"


class LimitIterDataset(IterDataset):
    """The first ``count`` elements of ``parent``.

    Example:
      >>> from grainlike.dataset import MapDataset
      >>> list(LimitIterDataset(MapDataset.range(5).to_iter_dataset(), 2))
      [0, 1]

    Raises:
      ValueError: ``count <= 0``.
    """

    _element_spec = parent_element_spec

    def __init__(self, parent: IterDataset, count: int):
        if count <= 0:
            raise ValueError(f"Count must be a non-negative integer. Got {count}")
        super().__init__(parent)
        self._count = count

    def __iter__(self) -> DatasetIterator:
        return _LimitDatasetIterator(self._parent.__iter__(), self._count)

    def __str__(self) -> str:
        return f"LimitIterDataset(count={self._count})"
