"""The records a DataLoader's sampler chooses, and their reading: where a DataLoader starts.

* ``SamplerMapDataset``: element ``i`` is the ``Record`` at shard-local position
  ``i`` of the sampler's stream: its metadata (global index, record key, rng) and
  its data. A chunk of positions is located in one call of the sampler contract
  (``BaseSampler.locate``, ``located_columns``) and read in one batched read of
  the source.
* ``ReadRecordsIterDataset``: its ``to_iter_dataset()``. It reads the records'
  data in chunks as long as the caps allow after the first record (in read
  threads where the source's reads wait), not reading the positions an elastic
  restore skips, and hands them over one ``Record`` at a time, or as a
  ``Chunk`` whose metadata are columns (``RecordColumns``) to the maps, filters
  and batch above it (``grainlike.dataset.transformations.chunk``), which then
  build no ``Record`` per record and a record's rng only when a random
  transform asks for it.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any, Optional, Sequence

import numpy as np

from grainlike.core import monitoring
from grainlike.core.errors import add_note
from grainlike.core.record import LazyRng, Record, RecordMetadata
from grainlike.core.samplers import BaseSampler, as_sampler
from grainlike.core.sharding import ShardOptions, strided_shard_size
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.transformations.chunk import Chunk
from grainlike.dataset.transformations.prefetch import PrefetchDatasetIterator, PrefetchIterDataset
from grainlike.sources.protocol import SupportsBatchedRead

# Read chunks never exceed this many records, nor about this many bytes of data:
# a chunk is still in the CPU cache (L2) when its records are copied into their
# batch (W3's 256 KiB records: 8.3-8.6 GB/s against 8.0 with 8 MiB chunks).
MAX_CHUNK = 256
CHUNK_BYTES = 2 << 20
# The sampler locates this many positions at a time: its vectorised shuffle costs
# ~0.7 us per record in calls of 256 indices, ~0.09 us in calls of 4096.
_LOCATE_AHEAD = 4096


def short_repr(obj: Any, limit: int = 200) -> str:
    """``repr(obj)`` cut to ``limit`` characters; never raises."""
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SamplerMapDataset(MapDataset):
    """The records a sampler chooses for one shard, by shard-local position.

    Element ``i`` is ``Record(metadata, source[metadata.record_key])`` for the
    sampler's global index ``(start + i * step) * shard_count + shard_index``
    (``start, step``: 0 and 1 unless sliced). The shard has
    ``strided_shard_size(len(sampler), shard_options)`` positions: without
    ``drop_remainder`` the first ``len(sampler) % shard_count`` shards read one
    more (grain's main branch; grain 0.2.18 drops them whatever the option).
    Slicing (a worker's share) stays a ``SamplerMapDataset``, so a chunk of
    positions is always one vectorised ``locate`` and one batched read.

    Args:
      data_source: random-access source (``len`` and ``[key]``; ``__getitems__``
        is used when present).
      sampler: a grainlike sampler, or any object with grain's ``__getitem__ ->
        RecordMetadata`` (wrapped by ``as_sampler``).
      shard_options: which shard this process reads.
    """

    # Locating records does not wait; whether reading them does is its parent's
    # (the source's) to say: grainlike.dataset.transformations.read_threads.
    waits = False

    def __init__(self, data_source: Any, sampler: Any, shard_options: ShardOptions):
        # The source is the parent, as in grain: stages that look for sources
        # (whether reads wait) find it.
        super().__init__(MapDataset.source(data_source))
        self._data_source = data_source
        self._batched_read = data_source.__getitems__ if isinstance(data_source, SupportsBatchedRead) else None
        self._sampler = sampler
        self._locator: BaseSampler = as_sampler(sampler)
        self._shard_index = shard_options.shard_index
        self._shard_count = shard_options.shard_count
        self._local_length = strided_shard_size(len(self._locator), shard_options)
        self._start, self._step, self._length = 0, 1, self._local_length

    @property
    def data_source(self) -> Any:
        return self._data_source

    @property
    def local_length(self) -> int:
        """How many positions the shard has (before slicing)."""
        return self._local_length

    @property
    def locator(self) -> BaseSampler:
        """The sampler, as the sampler contract."""
        return self._locator

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        sliced = "" if (self._start, self._step) == (0, 1) else f", positions {self._start}::{self._step}"
        return (
            f"SamplerMapDataset(sampler={short_repr(self._sampler, 120)}, shard "
            f"{self._shard_index} of {self._shard_count}{sliced})"
        )

    def slice(self, sl: slice) -> "SamplerMapDataset":
        """The positions of ``sl``, as a sampler stage of its own."""
        if not isinstance(sl, slice):
            raise ValueError(f"sl is not a slice: {type(sl)}")
        start, stop, step = sl.indices(self._length)
        out = copy.copy(self)
        out._start = self._start + start * self._step
        out._step = self._step * step
        out._length = len(range(start, stop, step))
        return out

    def global_indices(self, positions: Sequence[int]) -> np.ndarray:
        """The sampler's global indices of shard-local ``positions``."""
        if isinstance(positions, range):
            local = np.arange(positions.start, positions.stop, positions.step, dtype=np.int64)
        else:
            local = np.asarray(positions, dtype=np.int64)
        if (self._start, self._step) != (0, 1):
            local = local * self._step + self._start
        if self._shard_count != 1:
            local = local * self._shard_count + self._shard_index
        return local

    def read_all(self, keys: list) -> list:
        """The source's records of ``keys``, in one batched read where the source has one."""
        start = monitoring.recording and time.perf_counter_ns()  # grain's source metrics, with telemetry on
        read = self._batched_read
        values = list(read(keys)) if read is not None else [self._data_source[k] for k in keys]
        if start:
            monitoring.record_read(self._data_source, values, start, len(keys))
        return values

    def read_one(self, key: Any, index: int) -> Any:
        """The record of ``key``; an error names it and its global ``index``."""
        try:
            start = monitoring.recording and time.perf_counter_ns()
            value = self._data_source[key]
            if start:
                monitoring.record_read(self._data_source, value, start, 1)
            return value
        except Exception as e:
            add_note(
                e,
                f"grainlike: while reading record_key {key} (global index {index}) from data "
                f"source {short_repr(self._data_source)}",
            )
            raise

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        (metadata,) = self._getmetadata([index])
        return Record(metadata, self.read_one(metadata.record_key, metadata.index))

    def _getmetadata(self, positions: Sequence[int]) -> list:
        gidx = self.global_indices(positions)
        return RecordColumns(*located_columns(gidx, self._locator.locate(gidx), 0, len(gidx)), []).metadata()

    def _getitems(self, indices: Sequence[int]) -> list:
        # On an error the reading stage reads the chunk again one record at a
        # time (__getitem__), so the error names the record that failed.
        metadata = self._getmetadata(indices)
        values = self.read_all([m.record_key for m in metadata])
        return [Record(m, v) for m, v in zip(metadata, values)]

    def to_iter_dataset(self, read_options: Any = None, *, allow_nones: bool = False) -> IterDataset:
        """Reads the records in order, in chunks (``ReadRecordsIterDataset``)."""
        return ReadRecordsIterDataset(self, read_options=read_options, allow_nones=allow_nones)


def located_columns(global_indices: np.ndarray, located: Any, lo: int, hi: int) -> tuple[list, list, Optional[list]]:
    """Global indices, record keys and rng keys of records ``lo:hi`` of a sampler's ``locate``.

    The rng keys are a list of seeds, or a grain-protocol sampler's own metadata
    (whose ``rng`` the transforms use), or None without a seed.
    """
    metadata = located.metadata
    if metadata is not None:
        metadata = metadata[lo:hi]
        return [m.index for m in metadata], [m.record_key for m in metadata], list(metadata)
    seeds = None if located.seeds is None else located.seeds[lo:hi].tolist()
    indices = global_indices if located.indices is None else located.indices
    return indices[lo:hi].tolist(), located.keys[lo:hi].tolist(), seeds


def _metadata(indices: list, keys: list, rngs: Optional[list], i: int) -> RecordMetadata:
    """Record ``i``'s ``RecordMetadata`` from its columns (see ``RecordColumns``)."""
    rng = None if rngs is None else rngs[i]
    if type(rng) is int:
        rng = LazyRng(rng)
    elif rng is not None and type(rng) is not LazyRng:
        return rng  # A grain-protocol sampler's metadata.
    return RecordMetadata(indices[i], keys[i], rng)


class RecordColumns:
    """The metadata of a chunk's records, as columns (a ``Chunk``'s ``meta``).

    Attributes:
      indices: the records' global indices.
      keys: their record keys.
      rngs: None (the sampler has no seed), or per record its rng key: a seed,
        the ``LazyRng`` a random transform asked for (``holders``), or the
        record's own ``RecordMetadata`` (a grain-protocol sampler's, or that of
        a record that came alone).
      spare: generators of batched records nothing refers to any more, which
        later records reuse (``LazyRng.recycle``: resetting one costs a third
        of a new one); shared by the chunks of one reading.
    """

    __slots__ = ("indices", "keys", "rngs", "spare")

    def __init__(self, indices: list, keys: list, rngs: Optional[list], spare: list):
        self.indices, self.keys, self.rngs, self.spare = indices, keys, rngs, spare

    @staticmethod
    def of(records: list) -> "RecordColumns":
        """The columns of ``records`` (their metadata as the rng keys)."""
        metadata = [r.metadata for r in records]
        return RecordColumns([m.index for m in metadata], [m.record_key for m in metadata], metadata, [])

    def head(self, n: int) -> "RecordColumns":
        rngs = self.rngs
        return RecordColumns(self.indices[:n], self.keys[:n], None if rngs is None else rngs[:n], self.spare)

    def select(self, sel: list) -> "RecordColumns":
        rngs = self.rngs
        return RecordColumns(
            [self.indices[i] for i in sel],
            [self.keys[i] for i in sel],
            None if rngs is None else [rngs[i] for i in sel],
            self.spare,
        )

    def concat(self, others: list) -> "RecordColumns":
        out = RecordColumns(list(self.indices), list(self.keys), None if self.rngs is None else list(self.rngs), self.spare)
        for other in others:
            out.indices += other.indices
            out.keys += other.keys
            if out.rngs is not None:
                out.rngs += other.rngs
        return out

    def holders(self) -> Optional[list]:
        """The records' rngs for a random transform: a ``LazyRng`` per seed (the generator is built on use)."""
        rngs = self.rngs
        if rngs and type(rngs[0]) is int:
            # Later random transforms, and the batch's metadata, share the placeholder.
            rngs = self.rngs = [LazyRng(s) for s in rngs]
        return rngs

    def metadata(self) -> list:
        """The records' ``RecordMetadata``."""
        return [_metadata(self.indices, self.keys, self.rngs, i) for i in range(len(self.indices))]

    def elements(self, values: list) -> list:
        """The records themselves."""
        return [Record(m, v) for m, v in zip(self.metadata(), values)]

    def batch_metadata(self) -> RecordMetadata:
        """A batch's metadata: its last record's without the record key, sharing its rng.

        The batch's other records are done: the generators nothing else refers
        to serve later records.
        """
        rngs = self.rngs
        metadata = _metadata(self.indices, self.keys, rngs, len(self.indices) - 1).remove_record_key()
        if rngs and type(rngs[-1]) is LazyRng:
            spare = self.spare
            for holder in rngs[:-1]:
                if len(spare) >= MAX_CHUNK:
                    break
                holder.recycle(spare)
        return metadata


class _LocatedRecords(MapDataset):
    """Element ``i``: the source's value of the sampler's record at position ``i``, whose metadata ``columns`` gives.

    Positions are located ``_LOCATE_AHEAD`` at a time, for the read threads
    (which read the keys) and the iterator (which hands over the records) alike:
    each locates where the other did, mostly.
    """

    # Locating does not wait; the reads are the source's (its parent's) to say.
    waits = False

    def __init__(self, records: SamplerMapDataset):
        super().__init__(records)
        self._records = records
        self._length = len(records)
        # A shuffled sampler builds one permutation per epoch a locate touches:
        # over a small source, 4096 positions would span hundreds of epochs.
        try:
            per_epoch = len(records.data_source)
        except TypeError:
            per_epoch = _LOCATE_AHEAD
        self._ahead = max(1, min(_LOCATE_AHEAD, per_epoch))
        self._vectorised = False  # Whether the sampler locates many indices per call.
        # The last two spans located, (start, stop, global indices, SampledIndices):
        # read threads and the iterator may be in different ones.
        self._spans: list = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._length

    def _span(self, start: int, stop: int) -> tuple:
        """A span holding ``start``, located now (to ``stop`` at least) if no span holds it."""
        with self._lock:
            for span in self._spans:
                if span[0] <= start < span[1]:
                    return span
            # A grain-protocol sampler (its own metadata) is called for each
            # record anyway: it is called for the positions asked only.
            end = min(self._length, max(stop, start + self._ahead)) if self._vectorised else stop
            gidx = self._records.global_indices(range(start, end))
            located = self._records.locator.locate(gidx)
            self._vectorised = located.metadata is None
            span = (start, end, gidx, located)
            self._spans = [span] + self._spans[:1]
            return span

    def columns(self, start: int, stop: int) -> tuple:
        """``located_columns`` of positions ``[start, stop)``."""
        span = self._span(start, stop)
        end = min(stop, span[1])
        columns = located_columns(span[2], span[3], start - span[0], end - span[0])
        if end < stop:  # Across two spans (those of the reads, which run ahead).
            rest = self.columns(end, stop)
            columns = tuple(None if a is None else a + b for a, b in zip(columns, rest))
        return columns

    def _keys(self, start: int, stop: int) -> list:
        span = self._span(start, stop)
        located, lo, hi = span[3], start - span[0], min(stop, span[1]) - span[0]
        keys = [m.record_key for m in located.metadata[lo:hi]] if located.metadata is not None else located.keys[lo:hi].tolist()
        return keys if hi + span[0] >= stop else keys + self._keys(hi + span[0], stop)

    def __getitem__(self, index):
        # One record (after a batched read failed): its error names it.
        indices, keys, _ = self.columns(index, index + 1)
        return self._records.read_one(keys[0], indices[0])

    def _getitems(self, positions: Sequence[int]) -> list:
        # Positions come as a range, or a list without those an elastic restore skips.
        if not len(positions):
            return []
        start, stop = positions[0], positions[-1] + 1
        keys = self._keys(start, stop)
        if len(positions) < stop - start:
            keys = [keys[p - start] for p in positions]
        return self._records.read_all(keys)

    def __str__(self) -> str:
        return f"LocatedRecords({self._records})"


class ReadRecordsIterDataset(PrefetchIterDataset):
    """``to_iter_dataset()`` of the sampler's records: chunks as long as the caps allow.

    A chunk of records is only located and read (the operations come after), so
    after the first record, which learns the records' size, every chunk is as
    long as the caps allow (256 records, about 2 MiB of data): few calls of the
    sampler and the source, and allocations of one size (growing chunks cost
    W3 a fifth of its throughput in page faults).
    """

    def __iter__(self) -> "ReadRecordsIterator":
        return ReadRecordsIterator(self._parent, self._read_options, self.read_threads())

    def __str__(self) -> str:
        return f"ReadRecordsIterDataset(read_options={self._read_options})"


class ReadRecordsIterator(PrefetchDatasetIterator):
    """Iterates a ``ReadRecordsIterDataset``: ``Record``s, or ``Chunk``s of their data and metadata columns."""

    _double_chunks = False  # Reads only read: after the first record, full chunks.
    _max_chunk_bytes = CHUNK_BYTES
    _fitted = False

    def __init__(self, records: SamplerMapDataset, read_options: Any, threads: int):
        super().__init__(_LocatedRecords(records), read_options, True, threads)
        self._spare: list = []  # (RecordColumns.spare)
        self._located: tuple = (0, [], [], None)  # Columns of positions from the first, for next().

    def _fit_chunk(self, values: list) -> None:
        # A source's records are alike: their size is measured on the first chunk only.
        if not self._fitted and values:
            self._fitted = True
            super()._fit_chunk(values)

    def __next__(self) -> Record:
        data = PrefetchDatasetIterator.__next__(self)
        position = self._next_index - 1
        start, indices, keys, rngs = self._located
        if not 0 <= position - start < len(indices):
            start = position
            indices, keys, rngs = self._map_parent.columns(start, min(self._length, start + MAX_CHUNK))
            self._located = (start, indices, keys, rngs)
        return Record(_metadata(indices, keys, rngs, position - start), data)

    def take(self, k: int) -> Chunk:
        chunk = super().take(k)
        start = chunk.start
        chunk.meta = RecordColumns(*self._map_parent.columns(start, start + len(chunk.values)), self._spare)
        return chunk

    def __str__(self) -> str:
        return f"ReadRecordsIterator(read_options={self._read_options})"
