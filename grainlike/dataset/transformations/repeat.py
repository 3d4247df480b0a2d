"""Repeating a dataset: a MapDataset over wrapped indices, an IterDataset by restarting."""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.nodes.state import non_negative_int, require_keys


class RepeatMapDataset(MapDataset):
    """``num_epochs`` epochs of the parent (``sys.maxsize`` elements for None).

    MapDataset indices past the end already wrap into later epochs, so this only
    sets the length; with ``reseed_each_epoch=False`` every index is folded into
    the first epoch, so random stages upstream repeat their first epoch.

    Raises:
      ValueError: ``num_epochs <= 0``, or the parent is already infinite.
    """

    _element_spec = parent_element_spec

    def _own_work_waits(self) -> bool:
        return False  # it only maps indices

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


class _RepeatDatasetIterator(DatasetIterator):
    """Restarts the parent from its first state at each end, ``num_epochs`` times."""

    def __init__(self, parent: DatasetIterator, num_epochs: Optional[int]):
        super().__init__(parent)
        self._num_epochs = num_epochs
        self._epoch = 0
        self._parent_start = self._parent.get_state()

    def __next__(self):
        if self._epoch == self._num_epochs:
            raise StopIteration
        while True:
            try:
                return next(self._parent)
            except StopIteration:
                self._epoch += 1
                if self._num_epochs is not None and self._epoch == self._num_epochs:
                    raise
                self._parent.set_state(self._parent_start)

    def get_state(self) -> dict:
        return {"parent": self._parent.get_state(), "epoch": self._epoch}

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("parent", "epoch"))
        epoch = non_negative_int(state, "epoch", self, upper=self._num_epochs)
        self._parent.set_state(state["parent"])
        self._epoch = epoch

    def __str__(self) -> str:
        return f"_RepeatDatasetIterator(num_epochs={self._num_epochs})"


class RepeatIterDataset(IterDataset):
    """Iterates over ``parent`` ``num_epochs`` times (forever for None).

    Each epoch restarts the parent from its first state, so every epoch is the
    same (unlike ``MapDataset.repeat``, random stages are not reseeded).

    Raises:
      ValueError: ``num_epochs <= 0``.
    """

    _element_spec = parent_element_spec

    def __init__(self, parent: IterDataset, num_epochs: Optional[int] = None):
        super().__init__(parent)
        if num_epochs is not None and num_epochs <= 0:
            raise ValueError(f"num_epochs must be positive, but got {num_epochs}.")
        self._num_epochs = num_epochs

    def __iter__(self) -> DatasetIterator:
        return _RepeatDatasetIterator(self._parent.__iter__(), self._num_epochs)

    def __str__(self) -> str:
        return f"RepeatIterDataset(num_epochs={self._num_epochs})"
