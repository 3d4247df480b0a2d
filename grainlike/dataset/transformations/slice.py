"""Slicing a MapDataset by a ``slice`` (``ds[1:10:2]``, shards ``ds[i::n]``) or by indices (``ds.slice([3, 1])``)."""

from __future__ import annotations

from typing import Any, Sequence

from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.transformations.read_threads import pipeline_waits


class SliceMapDataset(MapDataset):
    """The elements of the parent at the indices of a slice.

    Index ``i`` past the end wraps: epoch ``e`` of the slice reads epoch ``e`` of
    the parent.

    Raises:
      ValueError: ``sl`` is not a slice (grain's type).
    """

    _element_spec = parent_element_spec

    def _own_work_waits(self) -> bool:
        return False  # it only maps indices

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


class ReindexMapDataset(MapDataset):
    """The elements of the parent at a sequence of indices (``ds.slice([3, 1, 4])``).

    Element ``i`` is ``parent[indices[i]]``; ``indices`` may repeat, reorder and
    skip, and may itself be a ``MapDataset`` of ints. Index ``i`` past the end wraps
    as a slice does: epoch ``e`` of this dataset reads ``parent[indices[i % n] +
    e * len(parent)]``, so random stages above see the parent's later epoch.

    As in grain's main branch nothing is checked when the dataset is built: an
    index is added to the epoch offset and passed to the parent as it is, so an
    out-of-range or negative index reads what the parent gives for it (sources
    and ``range`` wrap it modulo their length), and an index that is not an int
    fails, with the ``TypeError`` that adding it to an int raises, when its
    element is read. ``len()`` of indices without a length raises ``TypeError``.

    Example:
      >>> from grainlike.dataset.nodes.map_dataset import MapDataset
      >>> list(MapDataset.range(10).slice([3, 1, 4, 1, 5]))
      [3, 1, 4, 1, 5]
    """

    _element_spec = parent_element_spec

    def __init__(self, parent: MapDataset, indices: Sequence[int]):
        super().__init__(parent)
        # Kept as given (not copied), as grain keeps it.
        self._indices = indices
        self._parent_length = len(parent)

    def _own_work_waits(self) -> bool:
        # Looking up a plain sequence does not wait; indices of a MapDataset wait
        # where that pipeline does.
        return isinstance(self._indices, MapDataset) and pipeline_waits(self._indices)

    def __len__(self) -> int:
        return len(self._indices)

    def _parent_index(self, index: int) -> Any:
        epoch, offset = divmod(index, len(self._indices))
        return self._indices[offset] + epoch * self._parent_length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return SliceMapDataset(self, index)
        return self._parent[self._parent_index(index)]

    def _getitems(self, indices: Sequence[int]) -> Sequence:
        n, plen = len(self._indices), self._parent_length
        epochs, offsets = [i // n for i in indices], [i % n for i in indices]
        if isinstance(self._indices, MapDataset):
            # One batched read of the index pipeline instead of one per element.
            chosen = self._indices._getitems(offsets)
        else:
            chosen = [self._indices[o] for o in offsets]
        return self._parent._getitems([c + e * plen for c, e in zip(chosen, epochs)])

    def __str__(self) -> str:
        idx = self._indices
        length = len(idx)
        shown = str(idx) if length <= 5 else f"[{idx[0]}, {idx[1]}, ..., {idx[-2]}, {idx[-1]}]"
        return f"ReindexMapDataset(indices={shown}, len={length})"
