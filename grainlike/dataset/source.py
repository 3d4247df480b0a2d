"""Source stages: a random-access data source, and a range of integers."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from grainlike.core.errors import add_note
from grainlike.dataset.base import IterDataset, MapDataset


class SourceMapDataset(MapDataset):
    """Wraps a random-access source (``len`` and ``[key]``; a list works too).

    Index ``i`` reads key ``i % len(source)``. Chunks are read with one call to the
    source's batched read (``__getitems__``, or grain's ``_getitems``) when it has
    one.
    """

    def __init__(self, source: Any):
        super().__init__()
        self._source = source
        batched = getattr(source, "__getitems__", None)
        if batched is None:
            batched = getattr(source, "_getitems", None)
        self._batched_read = batched

    def __len__(self) -> int:
        return len(self._source)

    def _key(self, index: int) -> int:
        # Sources of unknown length (None) are read by the index as it is.
        try:
            return index % len(self._source)
        except TypeError:
            return index

    def __str__(self) -> str:
        return f"SourceMapDataset(source={type(self._source).__name__})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        key = self._key(index)
        try:
            return self._source[key]
        except Exception as e:
            add_note(e, f"grainlike: while reading record key {key} (index {index}) from {self}")
            raise

    def _getitems(self, indices: Sequence[int]) -> list:
        if self._batched_read is None:
            return [self.__getitem__(i) for i in indices]
        try:
            n = len(self._source)
            keys = [i % n for i in indices]
        except TypeError:
            keys = list(indices)
        try:
            return list(self._batched_read(keys))
        except Exception as e:
            add_note(e, f"grainlike: while reading record keys {_shorten(keys)} from {self}")
            raise


class RangeMapDataset(MapDataset):
    """The integers of ``range(start, stop, step)``, like the builtin.

    Example:
      >>> ds = RangeMapDataset(3)
      >>> len(ds), ds[1], ds[4]
      (3, 1, 1)
    """

    def __init__(self, start: int, stop: Optional[int] = None, step: int = 1):
        super().__init__()
        self.start = 0 if stop is None else start
        self.stop = start if stop is None else stop
        self.step = step
        self._length = len(range(self.start, self.stop, self.step))

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        return f"RangeMapDataset(start={self.start}, stop={self.stop}, step={self.step})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self.start + (index % self._length) * self.step

    def _getitems(self, indices: Sequence[int]) -> list:
        start, step, n = self.start, self.step, self._length
        return [start + (i % n) * step for i in indices]

    def to_iter_dataset(self, read_options: Any = None, *, allow_nones: bool = False) -> IterDataset:
        # No read-ahead by default: there is nothing to wait for (as grain).
        from grainlike.dataset.options import ReadOptions

        return super().to_iter_dataset(
            read_options or ReadOptions(prefetch_buffer_size=0), allow_nones=allow_nones
        )


def _shorten(keys: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(k) for k in keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}] ({len(keys)} keys)"
