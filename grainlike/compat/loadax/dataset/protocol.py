"""``loadax.dataset.protocol``: a dataset is ``get(index)`` and ``len``.

A Loadax dataset's ``get`` returns None for an index it does not hold. The
datasets here also have ``dataset[i]`` (``IndexError`` out of range), so any of
them is a grainlike random-access source as it is:
``grainlike.loader(RangeDataset(0, 10))``.
"""

from __future__ import annotations

import abc
import operator
from typing import Any, Generic, Optional, TypeVar

DatasetItem = TypeVar("DatasetItem", covariant=True)


class DatasetIterator(Generic[DatasetItem]):
    """Iterates ``dataset.get(0)``, ``get(1)``, ... up to ``len(dataset)``.

    Loadax 0.2.1's iterator never stops: past the end it returns None forever,
    so a ``for`` loop over a dataset does not end. This one stops after
    ``len(dataset)`` items, as Loadax's docstrings show.

    Attributes:
      dataset: the dataset.
      current: the index read next.
    """

    def __init__(self, dataset: "Dataset[DatasetItem]"):
        self.current = 0
        self.dataset = dataset

    def __iter__(self) -> "DatasetIterator[DatasetItem]":
        return self

    def __next__(self) -> Optional[DatasetItem]:
        if self.current >= len(self.dataset):
            raise StopIteration
        item = self.dataset.get(self.current)
        self.current += 1
        return item


class Dataset(abc.ABC, Generic[DatasetItem]):
    """A random-access dataset: ``get(index)`` and ``len``; subclass it for your data.

    Example:
      >>> class Squares(Dataset):
      ...     def get(self, index):
      ...         return index * index if 0 <= index < 4 else None
      ...     def __len__(self):
      ...         return 4
      >>> list(Squares()), Squares().is_empty()
      ([0, 1, 4, 9], False)
    """

    @abc.abstractmethod
    def get(self, index: int) -> Optional[DatasetItem]:
        """The item at ``index``, or None where there is none."""
        raise NotImplementedError

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of items."""
        raise NotImplementedError

    def is_empty(self) -> bool:
        """True when the dataset has no items."""
        return len(self) == 0

    def __iter__(self) -> DatasetIterator[DatasetItem]:
        return DatasetIterator(self)

    def __getitem__(self, index: Any) -> Optional[DatasetItem]:
        """``get(index)`` for ``0 <= index < len``: the random access grainlike's sources have.

        Raises:
          IndexError: ``index`` outside ``[0, len)``.
        """
        position = operator.index(index)
        if not 0 <= position < len(self):
            raise IndexError(f"index {position} is out of range for {type(self).__name__} of length {len(self)}")
        return self.get(position)
