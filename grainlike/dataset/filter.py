"""Filter stages: a MapDataset marks removed elements None; an iterator skips them."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from grainlike.core.transforms import FilterTransform, transform_name
from grainlike.dataset.base import DatasetIterator, IterDataset, MapDataset
from grainlike.dataset.map import note_element, note_iterator, user_function


class FilterMapDataset(MapDataset):
    """``ds[i]`` is the parent's element if ``fn`` keeps it, else None."""

    def __init__(self, parent: MapDataset, transform: Any):
        super().__init__(parent)
        self._transform = transform
        self._fn = user_function(transform, FilterTransform, "filter", "filter")
        self._name = transform_name(transform)

    def __len__(self) -> int:
        return len(self._parent)

    def __str__(self) -> str:
        return f"FilterMapDataset(transform={self._name})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        element = self._parent[index]
        if element is None:
            return None
        try:
            return element if self._fn(element) else None
        except Exception as e:
            note_element(e, self, f"index {index}")
            raise

    def _getitems(self, indices: Sequence[int]) -> list:
        elements = self._parent._getitems(indices)
        fn = self._fn
        out: list = []
        append = out.append
        try:
            for x in elements:
                append(x if x is not None and fn(x) else None)
        except Exception as e:
            note_element(e, self, f"index {indices[len(out)]}")
            raise
        return out


class _FilterDatasetIterator(DatasetIterator):
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

    def get_state(self) -> dict:
        return self._parent.get_state()

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state)

    def __str__(self) -> str:
        return f"FilterDatasetIterator(transform={self._name})"


class FilterIterDataset(IterDataset):
    """Keeps the elements of an IterDataset for which ``fn`` is true."""

    def __init__(self, parent: IterDataset, transform: Any):
        super().__init__(parent)
        self._transform = transform
        self._fn = user_function(transform, FilterTransform, "filter", "filter")
        self._name = transform_name(transform)

    def __iter__(self) -> DatasetIterator:
        return _FilterDatasetIterator(self._parent.__iter__(), self._fn, self._name)

    def __str__(self) -> str:
        return f"FilterIterDataset(transform={self._name})"
