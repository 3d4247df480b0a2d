"""``CacheIterDataset``: an IterDataset's elements kept in memory as they are read.

Once the parent has ended, every position is served from memory, so a restore to
an earlier one (what ``repeat`` does at each epoch) replays the cache. The state
is grain's: ``{"parent", "position", "cache_filled"}``; restoring a position not
cached in this iterator re-reads the parent from its start.
"""

from __future__ import annotations

from typing import Any

from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.state import non_negative_int, require_keys


class _InMemoryCacheDatasetIterator(DatasetIterator):
    def __init__(self, parent: DatasetIterator):
        super().__init__(parent)
        self._cache: list = []
        self._position = 0
        self._cache_filled = False
        self._rebuild_cache = False
        self._starting_state = parent.get_state()
        # The parent's state of a restored state whose cache was filled: the
        # cache is filled before the next element (see set_state).
        self._fill_before_next = None

    def __next__(self):
        self._assert_not_closed()
        if self._fill_before_next is not None:
            self._fill(self._fill_before_next)
        if self._cache_filled:
            if self._position < len(self._cache):
                value = self._cache[self._position]
                self._position += 1
                return value
            raise StopIteration
        if self._rebuild_cache:
            self._parent.set_state(self._starting_state)
            self._cache = []
            self._rebuild_cache = False
            for _ in range(self._position):
                self._cache.append(next(self._parent))
        try:
            value = next(self._parent)
        except StopIteration:
            self._cache_filled = True
            raise
        if len(self._cache) == self._position:
            self._cache.append(value)
        self._position += 1
        return value

    def _fill(self, parent_state: Any) -> None:
        """Reads the whole parent into the cache, then restores ``parent_state``."""
        self._parent.set_state(self._starting_state)
        cache = list(self._parent)
        self._parent.set_state(parent_state)
        self._cache = cache
        self._cache_filled = True
        self._rebuild_cache = False
        self._fill_before_next = None

    def get_state(self) -> dict:
        filled = self._cache_filled or self._fill_before_next is not None
        return {"parent": self._parent.get_state(), "position": self._position, "cache_filled": filled}

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("parent", "position", "cache_filled"))
        position = non_negative_int(state, "position", self)
        self._parent.set_state(state["parent"])
        self._position = position
        if state["cache_filled"] and not self._cache_filled:
            # The parent's state says nothing about the position (a repeat may
            # have reset it): the whole parent is read into the cache before the
            # next element. grain instead refills up to the position and reports
            # the cache unfilled until the parent ends again, so its restored
            # states differ from the uninterrupted run's; here they are the same.
            self._fill_before_next = state["parent"]
            return
        self._fill_before_next = None
        if position > len(self._cache) and not self._cache_filled:
            # Elements before the position are missing from the cache: refill.
            self._rebuild_cache = True

    def __str__(self) -> str:
        return "InMemoryCacheDatasetIterator"


class CacheIterDataset(IterDataset):
    """Keeps the elements of ``parent`` in memory as they are first read.

    Only for data that fits in memory. Put it before a ``repeat`` so that later
    epochs are served from memory.

    Example:
      >>> from grainlike.dataset import MapDataset
      >>> calls = []
      >>> ds = MapDataset.range(3).to_iter_dataset().map(lambda x: calls.append(x) or x)
      >>> it = iter(CacheIterDataset(ds))
      >>> start = it.get_state()
      >>> list(it), it.set_state(start), list(it), calls
      ([0, 1, 2], None, [0, 1, 2], [0, 1, 2])
    """

    _element_spec = parent_element_spec

    def __iter__(self) -> DatasetIterator:
        return _InMemoryCacheDatasetIterator(self._parent.__iter__())

    def __str__(self) -> str:
        return f"CacheIterDataset(parent={self._parent})"
