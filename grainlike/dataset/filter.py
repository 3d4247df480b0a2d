"""Filter stages: a MapDataset marks removed elements None; an iterator skips them."""

from __future__ import annotations

from typing import Any, Callable

from grainlike.core.transforms import FilterTransform
from grainlike.dataset.base import DatasetIterator
from grainlike.dataset.map import (
    ElementwiseMapDataset,
    PassThroughStateIterator,
    TransformIterDataset,
    note_iterator,
)


class FilterMapDataset(ElementwiseMapDataset):
    """``ds[i]`` is the parent's element if ``fn`` keeps it, else None."""

    _accepts = FilterTransform
    _method = "filter"

    def _apply(self, index: int, element: Any) -> Any:
        return element if self._fn(element) else None


class _FilterDatasetIterator(PassThroughStateIterator):
    def __init__(self, parent: DatasetIterator, fn: Callable, name: str):
        super().__init__(parent)
        self._fn = fn
        self._name = name

    def __next__(self):
        parent, fn = self._parent, self._fn
        while True:
            element = next(parent)
            try:
                if fn(element):
                    return element
            except Exception as e:
                note_iterator(e, self, parent)
                raise

    def __str__(self) -> str:
        return f"FilterDatasetIterator(transform={self._name})"


class FilterIterDataset(TransformIterDataset):
    """Keeps the elements of an IterDataset for which ``fn`` is true."""

    _accepts = FilterTransform
    _method = "filter"

    def __iter__(self) -> DatasetIterator:
        return _FilterDatasetIterator(self._parent.__iter__(), self._fn, self._name)
