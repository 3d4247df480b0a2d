"""The DataLoader's operations up to its first Batch, on chunks of records.

The per-record stages (``stages.py``) build a ``RecordMetadata`` and a ``Record``
for every record and pass it through one ``__next__`` per operation: about 1.5 us
of CPU per record, five times what torch's DataLoader spends on a trivial record.
When the operations before the first ``Batch`` are maps and filters, this stage
does the same work a chunk at a time instead. The records are read by
``to_iter_dataset()``'s reading (``dataset.prefetch``, the Dataset API's) of a
``LocatedRecordsMapDataset``: the source's values of the sampler's records, by
position, one batched read per chunk of up to 256 records (about 2 MiB), in its
read threads where the source's reads wait (``ReadOptions``,
``dataset.read_threads``: chunks of up to 8 records, about
``prefetch_buffer_size`` ahead), positions an elastic restore skips
(``dataset.elastic.SkippingReader``) not read. This stage takes them a chunk at
a time (``PrefetchDatasetIterator.take``), locates their metadata (one ``locate``
of the sampler per 4,096 positions, shared with the reads), calls each
transform in a loop over the records the next batch needs, builds a record's
rng only when a random transform asks for it, and copies each record into its
row of the batch right after its transforms (``tree.Stacker``). It yields what
the per-record stages yield (the batch as a ``Record`` carrying the last
record's metadata without its record key), in the same order, with the same
random draws, and its state is the reading stage's: ``{"next_index": p}``, the
position of the first record not in a delivered batch.

Transforms run on the records a batch needs, when it needs them (as in the
per-record stages: a slow transform delays a batch by its own records only), so
errors come when the per-record stages would raise them; after an error the next
``next()`` starts again at the first record of the batch that failed.
"""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

from grainlike.core import tree
from grainlike.core.record import LazyRng, Record, RecordMetadata
from grainlike.core.samplers import BaseSampler
from grainlike.core.transforms import (
    Batch,
    FilterTransform,
    MapTransform,
    MapWithIndexTransform,
    RandomMapTransform,
    batch_elements,
)
from grainlike.dataset.iter_dataset import IterDataset
from grainlike.dataset.iterator import DatasetIterator
from grainlike.dataset.filter import FilterThresholdChecker
from grainlike.dataset.elastic import SkippingReader, skipped_in
from grainlike.dataset.map_dataset import MapDataset
from grainlike.dataset.options import ReadOptions
from grainlike.dataset.prefetch import NextIndexState, PrefetchDatasetIterator
from grainlike.loader import stages

# Chunks never exceed this many records, nor about this many bytes of data: a
# chunk is still in the CPU cache (L2) when its records are copied into their
# batch (W3's 256 KiB records: 8.3-8.6 GB/s against 8.0 with 8 MiB chunks).
_MAX_CHUNK = 256
_CHUNK_BYTES = 2 << 20
# Records of at least this many bytes are copied into their batch one by one
# (tree.Stacker); smaller ones are stacked at the end, which costs less per
# record (W2's 37 KiB images: 1-1.5% faster so).
_ROW_BYTES = 64 << 10
# The sampler locates this many positions at a time: its vectorised shuffle costs
# ~0.7 us per record in calls of 256 indices, ~0.09 us in calls of 4096.
_LOCATE_AHEAD = 4096

# Stands in the buffer for a record already copied into its batch (tree.Stacker).
_COPIED = object()

# What a step does to the chunk's data.
_MAP, _RANDOM_MAP, _MAP_WITH_INDEX, _FILTER = range(4)


def chunkable(operations: Sequence[Any]) -> bool:
    """Whether ``operations`` start with maps and filters followed by a Batch."""
    for op in operations:
        if isinstance(op, Batch):
            return True
        if not isinstance(op, (MapTransform, RandomMapTransform, MapWithIndexTransform, FilterTransform)):
            return False
    return False


def _kind(op: Any) -> int:
    if isinstance(op, RandomMapTransform):
        return _RANDOM_MAP
    if isinstance(op, MapWithIndexTransform):
        return _MAP_WITH_INDEX
    if isinstance(op, FilterTransform):
        return _FILTER
    return _MAP


class ChunkedRecordsIterDataset(stages.StacksBatches, IterDataset):
    """``operations[:batch_position + 1]`` of a DataLoader on chunks of its records.

    Args:
      records: the sampler's records (a ``SamplerMapDataset``).
      operations: the loader's operations; those before ``batch_position`` are
        maps and filters (``chunkable``), ``operations[batch_position]`` a Batch.
      batch_position: the index of the first Batch.
      padding: the padding sampler whose padding the Batch masks, or None.
      producer: what made the Batch's elements (named when their shapes differ).
      threads: read threads (0: read in the calling thread).
      buffer: with threads, about how many records are read ahead.
    """

    def __init__(
        self,
        records: stages.SamplerMapDataset,
        operations: Sequence[Any],
        batch_position: int,
        padding: Optional[BaseSampler] = None,
        producer: str = "",
        threads: int = 0,
        buffer: int = 0,
    ):
        super().__init__(records)
        self._threads = threads
        self._buffer = buffer
        self._steps = [(_kind(op), op, i) for i, op in enumerate(operations[:batch_position])]
        self._batch = operations[batch_position]
        self._batch_position = batch_position
        self._padding = padding if self._batch.pad else None
        self._producer = producer

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Reads only the positions of ``sl`` (a worker's share), in place.

        Only for a copy of the pipeline made for one worker.
        """
        if sequential_slice:
            raise NotImplementedError(f"{self}: sequential slices are not supported")
        self._parents = (self._parent.slice(sl),)

    def __iter__(self) -> "ChunkedRecordsDatasetIterator":
        return ChunkedRecordsDatasetIterator(
            self._parent, self._steps, self._batch, self._padding, self._producer, self._alloc, self._threads,
            self._buffer,
        )

    def __str__(self) -> str:
        ops = ", ".join(stages.describe_op(op) for _, op, _ in self._steps)
        return (
            f"ChunkedRecordsIterDataset(operations[:{self._batch_position + 1}] "
            f"[{ops}{', ' if ops else ''}{stages.describe_op(self._batch)}])"
        )

    def user_transforms(self) -> tuple:
        ops = [op for _, op, _ in self._steps] + [self._batch]
        return tuple(f for op in ops for f in stages.operation_functions(op))


class _Locator:
    """Global indices, record keys and rng keys of positions, located ``_LOCATE_AHEAD`` at a time.

    Shared by the read threads (which read the keys) and the iterator (which
    transforms the records): each locates where the other did, mostly.
    """

    def __init__(self, records: stages.SamplerMapDataset):
        self._records = records
        self.length = len(records)
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

    def _span(self, start: int, stop: int) -> tuple:
        with self._lock:
            for span in self._spans:
                if span[0] <= start and stop <= span[1]:
                    return span
            # A grain-protocol sampler (its own metadata) is called for each
            # record anyway: it is called for the positions asked only.
            end = min(self.length, max(stop, start + self._ahead)) if self._vectorised else stop
            gidx = self._records._global_indices(range(start, end))
            located = self._records.locator.locate(gidx)
            self._vectorised = located.metadata is None
            span = (start, end, gidx, located)
            self._spans = [span] + self._spans[:1]
            return span

    def columns(self, start: int, stop: int) -> tuple:
        """``stages.located_columns`` of positions ``[start, stop)``."""
        span = self._span(start, stop)
        return stages.located_columns(span[2], span[3], start - span[0], stop - span[0])

    def keys(self, start: int, stop: int) -> list:
        """The record keys of positions ``[start, stop)``."""
        span = self._span(start, stop)
        located, lo, hi = span[3], start - span[0], stop - span[0]
        if located.metadata is not None:
            return [m.record_key for m in located.metadata[lo:hi]]
        return located.keys[lo:hi].tolist()


class LocatedRecordsMapDataset(MapDataset):
    """Element ``i``: the source's value of the sampler's record at position ``i`` (no metadata).

    What the chunked stage reads ahead through ``to_iter_dataset()``'s reading
    (``dataset.prefetch``); it locates the records it transforms with the same
    ``_Locator``.
    """

    # Locating does not wait; the reads are the source's (its parent's) to say.
    waits = False

    def __init__(self, records: stages.SamplerMapDataset, locator: _Locator):
        super().__init__(records)
        self._records = records
        self._locator = locator
        # Positions an elastic restore skips (sorted; set by the iterator): not
        # read, None in their place, which the reading drops.
        self.skip: list = []

    def __len__(self) -> int:
        return self._locator.length

    def __getitem__(self, index):
        if skipped_in(self.skip, index, index + 1):
            return None
        # One record (after a batched read failed): its error names it.
        indices, keys, _ = self._locator.columns(index, index + 1)
        return self._records._read_one(keys[0], indices[0])

    def _getitems(self, positions: Sequence[int]) -> list:
        # Positions come as a range (a read chunk of to_iter_dataset()).
        if not len(positions):
            return []
        start, stop = positions[0], positions[-1] + 1
        keys = self._locator.keys(start, stop)
        skipped = set(skipped_in(self.skip, start, stop))
        if not skipped:
            return self._records._read_all(keys)
        kept = [i for i in range(stop - start) if start + i not in skipped]
        out: list = [None] * (stop - start)
        for i, value in zip(kept, self._records._read_all([keys[i] for i in kept]) if kept else ()):
            out[i] = value
        return out

    def __str__(self) -> str:
        return f"LocatedRecordsMapDataset({self._records})"


class _ReadAheadIterator(PrefetchDatasetIterator):
    """``to_iter_dataset()``'s reading of a ``LocatedRecordsMapDataset``: chunks as long as the caps allow."""

    _double_chunks = False  # Reads only read: after the first record, full chunks.
    _max_chunk_bytes = _CHUNK_BYTES
    _fitted = False

    def _fit_chunk(self, values: list) -> None:
        # A source's records are alike: their size is measured on the first chunk only.
        if not self._fitted and values:
            self._fitted = True
            super()._fit_chunk(values)

    def __str__(self) -> str:
        return f"ReadAheadIterator(read_options={self._read_options})"


class ChunkedRecordsDatasetIterator(SkippingReader, NextIndexState, DatasetIterator):
    """Iterates a ``ChunkedRecordsIterDataset``; see the module docstring."""

    def __init__(
        self,
        records: stages.SamplerMapDataset,
        steps: list,
        batch: Batch,
        padding: Optional[BaseSampler],
        producer: str,
        alloc: Optional[tree.Allocator],
        threads: int = 0,
        buffer: int = 0,
    ):
        self._locator = _Locator(records)
        # The records are read (ahead, in threads if asked) by to_iter_dataset()'s
        # reading, which does not skip or drop anything but an elastic restore's positions.
        reader = _ReadAheadIterator(
            LocatedRecordsMapDataset(records, self._locator),
            ReadOptions(num_threads=threads, prefetch_buffer_size=buffer),
            True,
            threads,
        )
        super().__init__(reader)
        self._reader = reader
        self._length = len(records)
        self._steps = steps
        self._random = any(kind == _RANDOM_MAP for kind, _, _ in steps)
        self._filters = any(kind == _FILTER for kind, _, _ in steps)
        self._batch = batch
        self._size = batch.batch_size
        self._plain_batch = not batch.pad and batch.batch_fn is None
        self._padding = padding
        self._producer = producer
        self._alloc = alloc
        self._checkers: dict = {}  # Filter position -> grain's threshold check (or None).
        self._next_index = 0  # Position of the first record not in a delivered batch.
        # Generators of batched records that nothing else refers to, reused for
        # later records (LazyRng.recycle): resetting one costs a third of a new one.
        self._spare_rngs: list = []
        self._restart_at(0)

    # -- reading and transforming a chunk ---------------------------------------

    def _restart_at(self, index: int) -> None:
        """Drops everything read ahead; the next read starts at ``index``."""
        self._next_index = index
        self._at_end = False
        # The buffered records, from _next_index on, in parallel lists.
        self._values: list = []
        self._indices: list = []  # Global indices.
        self._keys: list = []
        self._rngs: Optional[list] = None  # Seeds, LazyRngs or a grain sampler's metadata.
        # Positions of the buffered records: with filters or skipped positions
        # (an elastic restore's), the records of a batch are not consecutive.
        skips = bool(self._skipped(index, self._length))
        self._positions: Optional[list] = [] if self._filters or skips else None
        self._error: Optional[BaseException] = None  # Raised when the buffer runs out.
        # Records read and not transformed yet: values, global indices, keys, rng
        # keys (or None) and positions (with filters, else None), and the error
        # of the read after them.
        self._raw: list = [[], [], [], None, None]
        self._raw_error: Optional[BaseException] = None
        reader = self._reader
        reader._skip = reader._map_parent.skip = self._skip
        reader._restart_at(index)
        reader._next_skip = 0

    def _read_chunk(self) -> None:
        """Takes the next records read into the read buffer (with the read's error, if any)."""
        reader = self._reader
        error = None
        try:
            values = reader.take(_MAX_CHUNK)
        except StopIteration:
            values = []
            self._at_end = True
        except Exception as e:
            values, error = [], e
        n = len(values)
        start = reader._next_index - n  # (consecutive: the reader skips nothing else)
        indices, keys, rngs = self._locator.columns(start, start + n)
        if rngs is not None and self._random and rngs and type(rngs[0]) is int:
            # A placeholder per record: the first random transform builds the
            # generator; later ones and the batch's metadata share it.
            rngs = [LazyRng(s) for s in rngs]
        positions = None if self._positions is None else list(range(start, start + n))
        self._raw = [values, indices, keys, rngs, positions]
        self._raw_error = error

    def _fill(self, need: int) -> None:
        """Transforms up to ``need`` more read records, reading a chunk when none are left.

        Transforms run only on the records a batch needs, as in the per-record
        stages: a slow transform does not delay a batch by a whole chunk.
        """
        if not self._raw[0]:
            if self._raw_error is None:
                self._read_chunk()
            if not self._raw[0]:
                self._error = self._raw_error  # The read failed at its first record.
                return
        raw = self._raw
        k = min(need, len(raw[0]))
        values, indices, keys, rngs, positions = (None if xs is None else xs[:k] for xs in raw)
        for xs in raw:
            if xs is not None:
                del xs[:k]
        error = None
        for kind, op, _ in self._steps:
            if len(values) < len(indices):  # A transform failed.
                n = len(values)
                indices, keys = indices[:n], keys[:n]
                rngs = None if rngs is None else rngs[:n]
                positions = None if positions is None else positions[:n]
            if not values:
                break
            if kind == _FILTER:
                values, indices, keys, rngs, positions, failed = self._filter(op, values, indices, keys, rngs, positions)
            else:
                values, failed = self._map(kind, op, values, indices, keys, rngs)
            if failed is not None:
                error = failed  # Raised at an earlier record than any error before.
        n = len(values)
        self._values += values
        self._indices += indices[:n]
        self._keys += keys[:n]
        if rngs is not None:
            self._rngs = (self._rngs or []) + rngs[:n]
        if positions is not None:
            self._positions += positions[:n]
        self._error = error

    def _rng(self, rngs: Optional[list], i: int) -> Any:
        if rngs is None:
            return None
        holder = rngs[i]
        if type(holder) is LazyRng:
            return holder.build(self._spare_rngs)
        return holder.rng  # A grain-protocol sampler's metadata.

    def _map(self, kind: int, op: Any, values: list, indices: list, keys: list, rngs: Optional[list]) -> tuple:
        """``values`` through a map; stops at the first failing record."""
        out: list = []
        append = out.append
        try:
            if kind == _MAP:
                fn = op.map
                for v in values:
                    append(fn(v))
            elif kind == _RANDOM_MAP:
                fn = op.random_map
                if rngs and type(rngs[0]) is LazyRng:
                    spare = self._spare_rngs
                    for v, holder in zip(values, rngs):
                        append(fn(v, holder.build(spare)))
                else:
                    rng = self._rng
                    for i, v in enumerate(values):
                        append(fn(v, rng(rngs, i)))
            else:
                fn = op.map_with_index
                for g, v in zip(indices, values):
                    append(fn(g, v))
        except Exception as e:
            stages.note_transform(e, op, indices[len(out)], keys[len(out)])
            return out, e
        except BaseException as e:  # sys.exit(), KeyboardInterrupt: noted, raised now (next() restarts the batch)
            stages.note_transform(e, op, indices[len(out)], keys[len(out)])
            raise
        return out, None

    def _filter(self, op: Any, values: list, indices: list, keys: list, rngs: Optional[list], positions: list) -> tuple:
        """Keeps what ``op.filter`` accepts; stops at the first failing record."""
        fn = op.filter
        checker = self._checkers.get(id(op), False)
        if checker is False:
            checker = self._checkers[id(op)] = FilterThresholdChecker.for_iterator(self)
        keep: list = []
        failed = None
        for i, v in enumerate(values):
            try:
                ok = fn(v)
            except Exception as e:
                failed = e
                stages.note_transform(e, op, indices[i], keys[i])
                break
            except BaseException as e:  # sys.exit(), KeyboardInterrupt: noted, raised now
                stages.note_transform(e, op, indices[i], keys[i])
                raise
            if checker is not None:
                try:
                    checker.check(ok)
                except Exception as e:
                    failed = e
                    break
            keep.append(ok)
        if failed is None and all(keep):
            return values, indices, keys, rngs, positions, None
        sel = [i for i, ok in enumerate(keep) if ok]

        def pick(xs: list) -> list:
            return [xs[i] for i in sel]

        return pick(values), pick(indices), pick(keys), None if rngs is None else pick(rngs), pick(positions), failed

    # -- batches --------------------------------------------------------------------

    def __next__(self) -> Record:
        if self._closed:
            self._assert_not_closed()
        size = self._size
        # Each record is copied into the batch right after its transforms, while
        # it is still in the cache (tree.Stacker); stacked at the end otherwise.
        stacker = tree.Stacker(size, self._alloc, _ROW_BYTES) if self._plain_batch else None
        added = 0
        try:
            while len(self._values) < size:
                if self._error is not None:
                    raise self._error
                if not self._raw[0] and self._raw_error is None and self._at_end:
                    break
                self._fill(size - len(self._values))
                if stacker is not None and stacker.active:
                    added = self._copy_in(stacker, added)
            n = min(size, len(self._values))
            if n == 0 or (n < size and self._batch.drop_remainder):
                # Every record was consumed, as the per-record stages consume them.
                self._restart_at(self._length)
                raise StopIteration
            values = self._values[:n]
            indices = self._indices[:n]
            try:
                data = None
                if stacker is not None and stacker.active:
                    self._copy_in(stacker, added)
                    data = stacker.result()
                if data is None:
                    if stacker is not None and stacker.count:
                        # Records let go of after their copy come back from their rows.
                        values = [stacker.element(i) if v is _COPIED else v for i, v in enumerate(values)]
                    data = batch_elements(self._batch, values, indices, self._padding, self._alloc)
            except Exception as e:
                stages.note_batch(e, self._batch, values, indices, self._keys[:n], self._producer)
                raise
        except StopIteration:
            raise
        except BaseException:
            # The next next() starts again at this batch's first record.
            self._restart_at(self._next_index)
            raise
        # The batch carries its last record's metadata without the record key.
        rngs = self._rngs
        rng = None if rngs is None else rngs[n - 1]
        if type(rng) is int:
            metadata = RecordMetadata(indices[-1], None, LazyRng(rng))
        elif rng is None or type(rng) is LazyRng:
            metadata = RecordMetadata(indices[-1], None, rng)
        else:
            metadata = rng.remove_record_key()  # A grain-protocol sampler's metadata.
        del self._values[:n], self._indices[:n], self._keys[:n]
        if rngs is not None:
            if type(rng) is LazyRng:
                # The batch's other records are done: their generators can serve
                # later records unless a transform kept them.
                spare = self._spare_rngs
                for holder in rngs[: n - 1]:
                    if len(spare) >= _MAX_CHUNK:
                        break
                    holder.recycle(spare)
            del rngs[:n]
        if self._positions is not None:
            # A short batch is the last: its records were pulled through every
            # filter to the end, as the per-record stages pull them.
            last = self._positions[n - 1] if n == size else self._length - 1
            del self._positions[:n]
            self._next_index = last + 1
        else:
            self._next_index += n
        return Record(metadata, data)

    def _copy_in(self, stacker: tree.Stacker, added: int) -> int:
        """Copies the records transformed since ``added`` into the batch; returns the new count.

        Copied records are let go of (``_COPIED`` in their place), so that the
        next ones can reuse their memory while it is in the cache.
        """
        values = self._values
        end = min(len(values), self._size)
        stacker.add(values, added, end)
        if stacker.unsuitable:
            # Records of this kind (e.g. Python scalars) are stacked at the end:
            # later batches do not try again.
            self._plain_batch = False
        for i in range(added, stacker.count):
            values[i] = _COPIED
        return end

    # -- the rest of the protocol (the state is SkippingReader's) -------------------------

    def start_prefetch(self) -> None:
        if not self._closed and not self._values:
            self._reader.start_prefetch()

    def _close(self) -> None:
        self._values = []
        super()._close()  # The reader's threads.

    def __str__(self) -> str:
        return f"ChunkedRecordsDatasetIterator({stages.describe_op(self._batch)})"
