"""Repeating a MapDataset: a longer (or infinite) length over the same wrapped indices."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from grainlike.dataset.base import MapDataset


class RepeatMapDataset(MapDataset):
    """``num_epochs`` epochs of the parent (``sys.maxsize`` elements for None).

    MapDataset indices past the end already wrap into later epochs, so this only
    sets the length; with ``reseed_each_epoch=False`` every index is folded into
    the first epoch, so random stages upstream repeat their first epoch.

    Raises:
      ValueError: ``num_epochs <= 0``, or the parent is already infinite.
    """

    def __init__(self, parent: MapDataset, num_epochs: Optional[int] = None, *, reseed_each_epoch: bool = True):
        super().__init__(parent)
        if num_epochs is not None and num_epochs <= 0:
            raise ValueError(f"num_epochs must be positive, but got {num_epochs}.")
        if len(parent) >= sys.maxsize:
            raise ValueError(f"Repeating already infinite dataset {parent} does nothing.")
        self._num_epochs = num_epochs
        self._parent_length = len(parent)
        if num_epochs is None:
            self._length = sys.maxsize if self._parent_length else 0
        else:
            self._length = num_epochs * self._parent_length
        self._reseed_each_epoch = reseed_each_epoch

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        return f"RepeatMapDataset(num_epochs={self._num_epochs})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        if not self._reseed_each_epoch:
            index = index % self._parent_length
        return self._parent[index]

    def _getitems(self, indices: Sequence[int]) -> Sequence:
        if not self._reseed_each_epoch:
            n = self._parent_length
            indices = [i % n for i in indices]
        return self._parent._getitems(indices)
