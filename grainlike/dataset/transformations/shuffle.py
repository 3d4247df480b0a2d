"""Shuffles: global (a keyed permutation of each epoch), and within windows."""

from __future__ import annotations

import copy
import itertools
from typing import Any, Optional, Sequence

import numpy as np

from grainlike.core.index_shuffle import index_shuffle
from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.nodes.state import non_negative_int, require_keys


class ShuffleMapDataset(MapDataset):
    """Element ``i`` of epoch ``e`` is the parent's element ``p(i) + e * len``.

    ``p`` is grain's ``index_shuffle`` (4 rounds) keyed by ``(seed + e) mod 2**32``,
    so each epoch is shuffled differently and the same seed gives grain's order.

    Raises:
      ValueError: no seed (neither given nor derived from ``ds.seed()``), or a seed
        outside ``[0, 2**32)``.
    """

    _element_spec = parent_element_spec

    def _own_work_waits(self) -> bool:
        return False  # it only reorders indices

    def __init__(self, parent: MapDataset, *, seed: Optional[int] = None):
        super().__init__(parent)
        seed = self._default_seed if seed is None else seed
        if seed is None:
            raise ValueError(
                f"`shuffle` requires a seed. Please provide it with `ds.seed(seed)` (shuffling {parent})"
            )
        if seed < 0 or seed >= 2**32:
            raise ValueError(f"Seed must be an integer between 0 and 2**32-1 (got {seed=}).")
        self._seed = int(seed)

    def __len__(self) -> int:
        return len(self._parent)

    def __str__(self) -> str:
        return "ShuffleMapDataset"

    def _epoch_seed(self, epoch: int) -> int:
        return (self._seed + epoch) % 2**32

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        n = len(self._parent)
        epoch, in_epoch = divmod(index, n)
        return self._parent[index_shuffle(in_epoch, n - 1, self._epoch_seed(epoch), 4) + epoch * n]

    def _getitems(self, indices: Sequence[int]) -> Sequence:
        n = len(self._parent)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size == 0:
            return self._parent._getitems([])
        if n == 0:
            raise ZeroDivisionError(f"{self}: cannot read index {idx[0]} of an empty dataset")
        epochs, in_epoch = np.divmod(idx, n)
        first, last = int(epochs.min()), int(epochs.max())
        if first == last:  # The common case: a chunk within one epoch.
            out = index_shuffle(in_epoch, n - 1, self._epoch_seed(first), 4) + first * n
        else:
            out = np.empty_like(idx)
            for epoch in np.unique(epochs).tolist():
                at = epochs == epoch
                out[at] = index_shuffle(in_epoch[at], n - 1, self._epoch_seed(epoch), 4) + epoch * n
        return self._parent._getitems(out.tolist())


class _WindowShuffle:
    """Shuffles within consecutive windows of ``window_size``; window ``w`` is keyed on ``seed + w``."""

    _element_spec = parent_element_spec

    def __init__(self, parent: Any, *, window_size: int, seed: int):
        super().__init__(parent)
        self._window_size = window_size
        self._seed = seed

    def __str__(self) -> str:
        return type(self).__name__


class WindowShuffleMapDataset(_WindowShuffle, MapDataset):
    """Shuffles within windows of indices; a partial last window reads into the parent's next epoch, as grain."""

    def _own_work_waits(self) -> bool:
        return False  # it only reorders indices

    def __len__(self) -> int:
        return len(self._parent)

    def _parent_index(self, index: int) -> int:
        window, in_window = divmod(index, self._window_size)
        return index_shuffle(in_window, self._window_size - 1, self._seed + window, 4) + window * self._window_size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[self._parent_index(index)]

    def _getitems(self, indices: Sequence[int]) -> Sequence:
        return self._parent._getitems([self._parent_index(i) for i in indices])


class _WindowShuffleDatasetIterator(DatasetIterator):
    """Reads a window, shuffles it, then hands it out; the state is where it started."""

    def __init__(self, parent: DatasetIterator, window_size: int, seed: int):
        super().__init__(parent)
        self._window_size = window_size
        self._seed = seed
        self._window_index = 0
        self._pos_in_window = 0
        self._window: list = []
        self._window_start = self._parent.get_state()
        self._exhausted = False

    def _fill(self) -> None:
        window = list(itertools.islice(self._parent, self._window_size))
        self._exhausted = len(window) < self._window_size
        # Elements leave from the end of the shuffled list.
        n = len(window)
        order = index_shuffle(np.arange(n, dtype=np.int64), n - 1, self._seed + self._window_index, 4) if n else []
        self._window = [window[i] for i in order]

    def __next__(self):
        if not self._window:
            if self._exhausted:
                raise StopIteration
            # A checkpoint refills the window from its start.
            self._window_start = self._parent.get_state()
            self._fill()
            self._pos_in_window = 0
        if not self._window:
            raise StopIteration
        self._pos_in_window += 1
        value = self._window.pop()
        if not self._window:
            self._window_index += 1
        return value

    def get_state(self) -> dict:
        return {
            "parent_window_start_state": copy.deepcopy(self._window_start),
            "window_index": self._window_index,
            "pos_in_window": self._pos_in_window,
        }

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("parent_window_start_state", "window_index", "pos_in_window"))
        # The window's seed is ``seed + window_index``, a 32-bit index_shuffle seed.
        window_index = non_negative_int(state, "window_index", self, upper=2**32 - 1 - self._seed)
        pos = non_negative_int(state, "pos_in_window", self)
        start = copy.deepcopy(state["parent_window_start_state"])
        self._parent.set_state(start)
        self._window_start = start
        self._window_index = window_index
        self._pos_in_window = pos
        self._exhausted = False
        self._fill()
        del self._window[len(self._window) - min(pos, len(self._window)) :]

    def __str__(self) -> str:
        return "WindowShuffleDatasetIterator"


class WindowShuffleIterDataset(_WindowShuffle, IterDataset):
    """Reads ``window_size`` elements at a time and returns each window shuffled."""

    def __iter__(self) -> DatasetIterator:
        return _WindowShuffleDatasetIterator(self._parent.__iter__(), self._window_size, self._seed)
