"""Source stages: a random-access data source, and a range of integers."""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import numpy as np

from grainlike.core import monitoring
from grainlike.core.errors import NonSequentialSliceError, add_note
from grainlike.dataset.nodes.dataset_node import walk
from grainlike.dataset.nodes.element_spec import ShapeDtypeStruct
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.nodes.worker_slice import sequential_range
from grainlike.dataset.transformations.read_threads import pipeline_waits
from grainlike.sources.protocol import SupportsBatchedRead
from grainlike.sources.waiting import source_waits


class SourceMapDataset(MapDataset):
    """Wraps a random-access source (``len`` and ``[key]``; a list works too).

    Index ``i`` reads key ``i % len(source)`` (of the worker's range after
    ``set_slice``); chunks are read with the source's batched read when it has one.
    """

    def _own_work_waits(self) -> bool:
        source = self._source
        return pipeline_waits(source) if isinstance(source, MapDataset) else source_waits(source)

    def __init__(self, source: Any):
        super().__init__()
        self._source = source
        batched = source.__getitems__ if isinstance(source, SupportsBatchedRead) else None
        self._batched_read = batched or getattr(source, "_getitems", None)  # grain's sources' name
        # grain's source metrics (with telemetry on): a source read through another
        # source stage is counted there, not twice.
        self._reads_count = not (
            isinstance(source, MapDataset) and any(isinstance(n, SourceMapDataset) for n in walk(source))
        )
        # A worker's contiguous range of keys (set_slice); None: the whole source.
        self._range: Optional[tuple[int, int]] = None

    def __len__(self) -> int:
        if self._range is not None:
            return self._range[1] - self._range[0]
        return len(self._source)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Keeps worker ``sl.start`` of ``sl.step``'s contiguous range of the source, in place.

        As ``RangeMapDataset.set_slice``; also raises ``ValueError`` when the
        source's length is unknown.
        """
        _require_sequential(self, sl, sequential_slice)
        try:
            length = len(self._source)
        except TypeError:
            length = None
        if not isinstance(length, int):
            raise ValueError(
                f"{self}: a sequential slice needs the source's length, and "
                f"len(source) is {length!r}"
            )
        self._range = sequential_range(length, sl, self)

    def _keys(self, indices: Sequence[int]) -> list:
        if self._range is not None:
            start, end = self._range
            return [start + i % (end - start) for i in indices]
        # Sources of unknown length (None) are read by the index as it is.
        try:
            n = len(self._source)
        except TypeError:
            return list(indices)
        return [i % n for i in indices]

    def __str__(self) -> str:
        return f"SourceMapDataset(source={type(self._source).__name__})"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        key = self._keys((index,))[0]
        try:
            return self._source[key]
        except Exception as e:
            add_note(e, f"grainlike: while reading record key {key} (index {index}) from {self}")
            raise

    def _getitems(self, indices: Sequence[int]) -> list:
        if self._batched_read is None:
            if monitoring.recording and self._reads_count:  # One record for the chunk, as a batched read's.
                start = time.perf_counter_ns()
                values = [_untimed_getitem(self, i) for i in indices]
                monitoring.record_read(self._source, values, start, len(indices))
                return values
            return [self.__getitem__(i) for i in indices]
        keys = self._keys(indices)
        try:
            start = monitoring.recording and self._reads_count and time.perf_counter_ns()
            values = list(self._batched_read(keys))
            if start:
                monitoring.record_read(self._source, values, start, len(keys))
            return values
        except Exception as e:
            add_note(e, f"grainlike: while reading record keys {_shorten(keys)} from {self}")
            raise


_untimed_getitem = SourceMapDataset.__getitem__


def _timed_getitem(self: SourceMapDataset, index: Any) -> Any:
    """``SourceMapDataset.__getitem__`` recording grain's source metrics (telemetry on)."""
    if not self._reads_count or isinstance(index, slice):
        return _untimed_getitem(self, index)
    start = time.perf_counter_ns()
    value = _untimed_getitem(self, index)
    monitoring.record_read(self._source, value, start, 1)
    return value


# One element at a time is the hot path of sources without batched reads: its
# timing is swapped in when telemetry starts, so that it costs nothing until then.
monitoring.on_recording(lambda: setattr(SourceMapDataset, "__getitem__", _timed_getitem))


class RangeMapDataset(MapDataset):
    """The integers of ``range(start, stop, step)``, like the builtin.

    Example:
      >>> ds = RangeMapDataset(3)
      >>> len(ds), ds[1], ds[4]
      (3, 1, 1)
    """

    @property
    def _element_spec(self) -> ShapeDtypeStruct:
        return ShapeDtypeStruct(shape=(), dtype=np.int64)

    def _own_work_waits(self) -> bool:
        return False  # it computes its integers

    def __init__(self, start: int, stop: Optional[int] = None, step: int = 1):
        super().__init__()
        self.start = 0 if stop is None else start
        self.stop = start if stop is None else stop
        self.step = step
        self._length = len(range(self.start, self.stop, self.step))
        # The whole range, which set_slice cuts a worker's share from.
        self._whole = (self.start, self._length)

    def __len__(self) -> int:
        return self._length

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Keeps worker ``sl.start`` of ``sl.step``'s contiguous part of the range, in place.

        Only for a worker's copy of the pipeline (``mp_prefetch`` or
        ``multithread_prefetch`` with ``sequential_slice=True``). The part is
        grain's even split of the whole range (``start``, ``stop`` change as in
        grain); a second call replaces the first.

        Raises:
          NonSequentialSliceError: ``sequential_slice`` is False (an
            ``AssertionError`` too, as grain raises).
          ValueError: ``sl`` is not ``slice(worker_index, None, worker_count)``.

        Example:
          >>> ds = RangeMapDataset(0, 20, 2)
          >>> ds.set_slice(slice(1, None, 3), sequential_slice=True)
          >>> list(ds)
          [8, 10, 12]
        """
        _require_sequential(self, sl, sequential_slice)
        first, length = self._whole
        begin, end = sequential_range(length, sl, self)
        self.start = first + begin * self.step
        self.stop = first + end * self.step
        self._length = end - begin

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
        from grainlike.dataset.nodes.options import ReadOptions

        return super().to_iter_dataset(
            read_options or ReadOptions(prefetch_buffer_size=0), allow_nones=allow_nones
        )


def _require_sequential(source: MapDataset, sl: slice, sequential_slice: bool) -> None:
    if not sequential_slice:
        raise NonSequentialSliceError(
            f"Only sequential slicing is supported. {source}: set_slice({sl}, "
            "sequential_slice=False) asks a source for every n-th record; a source "
            "slices itself only into contiguous ranges (sequential_slice=True). The "
            "stage of to_iter_dataset() takes every n-th element (its set_slice)."
        )


def _shorten(keys: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(k) for k in keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}] ({len(keys)} keys)"
