"""Slicing a MapDataset like a Python sequence (``ds[1:10:2]``, shards ``ds[i::n]``)."""

from __future__ import annotations

from typing import Sequence

from grainlike.dataset.map_dataset import MapDataset


class SliceMapDataset(MapDataset):
    """The elements of the parent at the indices of a slice.

    Index ``i`` past the end wraps: epoch ``e`` of the slice reads epoch ``e`` of
    the parent.

    Raises:
      ValueError: ``sl`` is not a slice (grain's type).
    """

    def __init__(self, parent: MapDataset, sl: slice):
        super().__init__(parent)
        if not isinstance(sl, slice):
            raise ValueError(f"sl is not a slice: {type(sl)}")
        self._parent_length = len(parent)
        self._start, self._stop, self._step = sl.indices(self._parent_length)
        self._length = len(range(self._start, self._stop, self._step))

    def __len__(self) -> int:
        return self._length

    def _parent_index(self, index: int) -> int:
        epoch, offset = divmod(index, self._length)
        return self._start + offset * self._step + epoch * self._parent_length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return SliceMapDataset(self, index)
        return self._parent[self._parent_index(index)]

    def _getitems(self, indices: Sequence[int]) -> Sequence:
        n, start, step, plen = self._length, self._start, self._step, self._parent_length
        parent_indices = [start + (i % n) * step + (i // n) * plen for i in indices]
        return self._parent._getitems(parent_indices)

    def __str__(self) -> str:
        return f"SliceMapDataset[{self._start}:{self._stop}:{self._step}]"
