"""The DataLoader's own stages: records chosen by a sampler, and operations on records.

grain 0.2.18 builds its DataLoader from Dataset stages over ``Record``s (see
``pipeline.py`` for the composition). These are the stages only a loader needs:

* ``SamplerMapDataset``: element ``i`` is the record at shard-local position ``i``
  of the sampler's stream: its metadata (global index, record key, rng) and its
  data. A chunk of positions is located in one call of the sampler contract
  (``BaseSampler.locate``, ``located_columns``) and read in one batched read of
  the source (``SamplerMapDataset._read_all``): the chunked path (``chunked.py``)
  locates and reads through the same two, and reads through ``to_iter_dataset()``
  as this one does.
* ``ReadRecordsIterDataset``: its ``to_iter_dataset()``, reading chunks as long
  as the caps allow after the first record, less the positions an elastic
  restore skips (``dataset.elastic.SkippingReader``).
* one stage per operation, on records: ``MapRecordsIterDataset`` (Map,
  RandomMap, MapWithIndex), ``FilterRecordsIterDataset``,
  ``BatchRecordsIterDataset`` (with ``pad=True`` and a padding sampler's mask)
  and ``OperationIterDataset`` (grain's legacy ``Operation``s). Their state is
  their parent's: every one is a function of the records it reads.

The stages above them (each record's data, grain's legacy state) are in
``grainlike.loader.output_stages``.

Errors raised by a transform keep their type and get a note naming the
operation, the record's global index and its record key.
"""

from __future__ import annotations

import collections
import copy
import itertools
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from grainlike.core import tree
from grainlike.core.errors import add_note
from grainlike.core.protocols import close_if_closeable
from grainlike.core.record import LazyRng, Record, RecordMetadata
from grainlike.core.samplers import BaseSampler, as_sampler
from grainlike.core.sharding import ShardOptions, strided_shard_size
from grainlike.core.transforms import (
    Batch,
    MapWithIndexTransform,
    RandomMapTransform,
    batch_elements,
    describe_op,
)
from grainlike.dataset.iter_dataset import IterDataset
from grainlike.dataset.iterator import DatasetIterator
from grainlike.dataset.map_dataset import MapDataset
from grainlike.dataset.filter import FilterThresholdChecker
from grainlike.dataset.map import PassThroughStateIterator
from grainlike.dataset.prefetch import PrefetchDatasetIterator, PrefetchIterDataset
from grainlike.sources.protocol import SupportsBatchedRead


def operation_functions(op: Any) -> tuple:
    """The user's code an operation runs: the transform, or a Batch's ``batch_fn``."""
    if isinstance(op, Batch):
        return () if op.batch_fn is None else (op.batch_fn,)
    return (op,)


def short_repr(obj: Any, limit: int = 200) -> str:
    """``repr(obj)`` cut to ``limit`` characters; never raises."""
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the sampler stage -------------------------------------------------------------------


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
    # (the source's) to say: grainlike.dataset.read_threads.
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

    def _global_indices(self, indices: Any) -> np.ndarray:
        if isinstance(indices, range):
            local = np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
        else:
            local = np.asarray(indices, dtype=np.int64)
        if (self._start, self._step) != (0, 1):
            local = local * self._step + self._start
        if self._shard_count != 1:
            local = local * self._shard_count + self._shard_index
        return local

    def _metadata(self, global_indices: np.ndarray) -> list:
        located = self._locator.locate(global_indices)
        if located.metadata is not None:
            return located.metadata  # A grain-protocol sampler's own metadata.
        gs, keys, seeds = located_columns(global_indices, located, 0, len(global_indices))
        if seeds is None:
            return [RecordMetadata(g, k) for g, k in zip(gs, keys)]
        return [RecordMetadata(g, k, LazyRng(s)) for g, k, s in zip(gs, keys, seeds)]

    def _read_all(self, keys: list) -> list:
        read = self._batched_read
        return list(read(keys)) if read is not None else [self._data_source[k] for k in keys]

    def _read_one(self, key: Any, index: int) -> Any:
        try:
            return self._data_source[key]
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
        (metadata,) = self._metadata(self._global_indices([index]))
        return Record(metadata, self._read_one(metadata.record_key, metadata.index))

    def to_iter_dataset(self, read_options: Any = None, *, allow_nones: bool = False) -> IterDataset:
        """Reads the records in order, in chunks (``ReadRecordsIterDataset``)."""
        return ReadRecordsIterDataset(self, read_options=read_options, allow_nones=allow_nones)

    def _getitems(self, indices: Sequence[int]) -> list:
        # On an error the reading stage reads the chunk again one record at a
        # time (__getitem__), so the error names the record that failed.
        metadata = self._metadata(self._global_indices(indices))
        values = self._read_all([m.record_key for m in metadata])
        return [Record(m, v) for m, v in zip(metadata, values)]


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


class ReadRecordsIterDataset(PrefetchIterDataset):
    """``to_iter_dataset()`` of the sampler's records: chunks as long as the caps allow.

    A chunk of records is only located and read (the operations come after), so
    after the first record, which learns the records' size, every chunk is as
    long as the caps allow (256 records, about 8 MiB of data): few calls of the
    sampler and the source, and allocations of one size (growing chunks cost
    W3 a fifth of its throughput in page faults). After an elastic restore it
    does not deliver the positions its state skips (as every ``to_iter_dataset()``).
    """

    def __iter__(self) -> "_ReadRecordsIterator":
        return _ReadRecordsIterator(self._parent, self._read_options, self._allow_nones, self.read_threads())

    def __str__(self) -> str:
        return f"ReadRecordsIterDataset(read_options={self._read_options})"


class _ReadRecordsIterator(PrefetchDatasetIterator):
    _double_chunks = False

    def _element_nbytes(self, element: Any) -> int:
        # The data: the metadata is small, and measuring it would build its rng.
        return tree.estimate_nbytes(element.data)

    def __str__(self) -> str:
        return f"ReadRecordsIterator(read_options={self._read_options})"


# -- operations on records ----------------------------------------------------------------


def note_transform(error: BaseException, op: Any, index: Optional[int], key: Any = None) -> None:
    """Notes the operation that failed and the record (global index, record key) it failed on."""
    on = "" if index is None else f" on the record at global index {index}"
    add_note(error, f"grainlike: in transform {describe_op(op)}{on}{'' if key is None else f', record_key {key}'}")


def note_record(error: BaseException, op: Any, record: Any) -> None:
    """``note_transform`` for a ``Record`` (or an element without metadata)."""
    m = getattr(record, "metadata", None)
    note_transform(error, op, None if m is None else m.index, None if m is None else m.record_key)


class StacksBatches:
    """A stage that stacks batches, into the allocator a worker gives it (shared memory)."""

    _alloc: Optional[tree.Allocator] = None

    def set_allocator(self, alloc: Optional[tree.Allocator]) -> None:
        """Stacks leaves into arrays from ``alloc(shape, dtype)`` (None: numpy)."""
        self._alloc = alloc


class _OperationStage(IterDataset):
    """A stage running ``operations[position]`` of a DataLoader on records."""

    def __init__(self, parent: IterDataset, op: Any, position: int):
        super().__init__(parent)
        self._op = op
        self._position = position

    def __str__(self) -> str:
        # Names the operation when the stage cannot be sent to the workers.
        return f"{type(self).__name__}(operations[{self._position}] {describe_op(self._op)})"

    def user_transforms(self) -> tuple:
        return operation_functions(self._op)


class _MapRecordsIterator(PassThroughStateIterator):
    """``map(data)``; subclasses call the transform's other methods."""

    def __init__(self, parent: DatasetIterator, op: Any, fn: Callable):
        super().__init__(parent)
        self._op = op
        self._fn = fn
        # Called once per record: the bound method, without next()'s lookups.
        self._pull = parent.__next__

    def __next__(self) -> Record:
        r = self._pull()
        try:
            r.data = self._fn(r.data)
        except BaseException as e:  # (sys.exit() too: noted, then raised)
            note_record(e, self._op, r)
            raise
        return r

    def __str__(self) -> str:
        return f"{type(self).__name__}({describe_op(self._op)})"


class _RandomMapRecordsIterator(_MapRecordsIterator):
    """``random_map(data, rng)`` with the record's own rng (built only here)."""

    def __next__(self) -> Record:
        r = self._pull()
        try:
            r.data = self._fn(r.data, r.metadata.rng)
        except BaseException as e:  # (sys.exit() too: noted, then raised)
            note_record(e, self._op, r)
            raise
        return r


class _MapWithIndexRecordsIterator(_MapRecordsIterator):
    """``map_with_index(global index, data)``."""

    def __next__(self) -> Record:
        r = self._pull()
        try:
            r.data = self._fn(r.metadata.index, r.data)
        except BaseException as e:  # (sys.exit() too: noted, then raised)
            note_record(e, self._op, r)
            raise
        return r


class MapRecordsIterDataset(_OperationStage):
    """A ``MapTransform``, ``RandomMapTransform`` or ``MapWithIndexTransform`` on each record's data."""

    def __iter__(self) -> DatasetIterator:
        op, parent = self._op, self._parent.__iter__()
        if isinstance(op, RandomMapTransform):
            return _RandomMapRecordsIterator(parent, op, op.random_map)
        if isinstance(op, MapWithIndexTransform):
            return _MapWithIndexRecordsIterator(parent, op, op.map_with_index)
        return _MapRecordsIterator(parent, op, op.map)


class _FilterRecordsIterator(_MapRecordsIterator):
    def __init__(self, parent: DatasetIterator, op: Any, fn: Callable):
        super().__init__(parent, op, fn)
        self._checker: Any = False  # grain's filter check, built once the options are final.

    def __next__(self) -> Record:
        pull, fn = self._pull, self._fn
        checker = self._checker
        if checker is False:
            checker = self._checker = FilterThresholdChecker.for_iterator(self)
        while True:
            r = pull()
            try:
                keep = fn(r.data)
            except BaseException as e:  # (sys.exit() too: noted, then raised)
                note_record(e, self._op, r)
                raise
            if checker is not None:
                checker.check(keep)
            if keep:
                return r


class FilterRecordsIterDataset(_OperationStage):
    """Keeps the records whose data a ``FilterTransform`` accepts."""

    def __iter__(self) -> DatasetIterator:
        return _FilterRecordsIterator(self._parent.__iter__(), self._op, self._op.filter)


class BatchRecordsIterDataset(StacksBatches, _OperationStage):
    """A ``Batch``: consecutive records' data stacked (or ``batch_fn``), in one record.

    The batch's record has the last record's metadata without its record key,
    as in grain. With ``pad=True`` a short batch is filled up with all-zero
    elements and a ``mask`` leaf says which elements are real; with a padding
    sampler (``padding``), the records it marks as padding are zeroed and masked
    too.

    Args:
      parent: the records.
      op: the ``Batch``.
      position: its index in the loader's operations.
      padding: the sampler whose padding this Batch masks, or None.
      producer: what made the elements (named when their shapes differ).
    """

    def __init__(
        self,
        parent: IterDataset,
        op: Batch,
        position: int,
        padding: Optional[BaseSampler] = None,
        producer: str = "",
    ):
        super().__init__(parent, op, position)
        self._padding = padding if op.pad else None
        self._producer = producer

    def __iter__(self) -> DatasetIterator:
        return _BatchRecordsIterator(self._parent.__iter__(), self._op, self._padding, self._producer, self._alloc)


class _BatchRecordsIterator(PassThroughStateIterator):
    def __init__(
        self,
        parent: DatasetIterator,
        op: Batch,
        padding: Optional[BaseSampler],
        producer: str,
        alloc: Optional[tree.Allocator],
    ):
        super().__init__(parent)
        self._op = op
        self._size = op.batch_size
        self._padding = padding
        self._producer = producer
        self._alloc = alloc

    def __next__(self) -> Record:
        records = list(itertools.islice(self._parent, self._size))
        if not records or (len(records) < self._size and self._op.drop_remainder):
            raise StopIteration
        values = [r.data for r in records]
        indices = [r.metadata.index for r in records]
        try:
            data = batch_elements(self._op, values, indices, self._padding, self._alloc)
        except Exception as e:
            note_batch(e, self._op, values, indices, [r.metadata.record_key for r in records], self._producer)
            raise
        return Record(records[-1].metadata.remove_record_key(), data)

    def __str__(self) -> str:
        return f"{type(self).__name__}({describe_op(self._op)})"


def note_batch(error: BaseException, op: Batch, values: list, indices: list, keys: list, producer: str) -> None:
    """Notes the Batch that failed, its records and those whose structure or shapes differ."""
    add_note(error, f"grainlike: in {describe_op(op)} of the records at global indices {indices} (record_keys {keys})")
    odd = "" if op.batch_fn is not None else odd_elements(values, indices, keys, producer)
    if odd:
        add_note(error, odd)


def odd_elements(values: list, indices: list, keys: list, producer: str) -> str:
    """Names the records whose structure or shapes differ from the most common one."""
    try:
        specs = [repr(tree.shape_spec(v)) for v in values]
        common, count = collections.Counter(specs).most_common(1)[0]
        if count == len(specs):
            return ""
        odd = [(g, k, s) for g, k, s in zip(indices, keys, specs) if s != common]
        lines = [f"  record_key {k} (global index {g}): {s}" for g, k, s in odd[:8]]
        if len(odd) > 8:
            lines.append(f"  ... and {len(odd) - 8} more")
        return (
            f"grainlike: {len(odd)} of the {len(values)} elements differ in structure or "
            f"shape from the other {count}, which are {common} (structure with leaf "
            f"shapes); the elements were produced by {producer}:\n" + "\n".join(lines)
        )
    except Exception:  # Never hide the original error.
        return ""


class _OperationIterator(PassThroughStateIterator):
    """grain's legacy ``Operation``: a function from the record iterator to an iterator.

    The operation is called at the first ``next()`` (not when the iterator is
    made: an iterator made only to read a state runs no user code), and again
    after ``set_state`` or an error, on the restored records.
    """

    def __init__(self, parent: DatasetIterator, op: Callable):
        super().__init__(parent)
        self._op = op
        self._outputs: Optional[Iterator] = None

    def __next__(self) -> Any:
        outputs = self._outputs
        if outputs is None:
            outputs = self._outputs = iter(self._op(self._parent))
        return next(outputs)

    def _drop_outputs(self) -> None:
        outputs, self._outputs = self._outputs, None
        close_if_closeable(outputs)

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state)
        self._drop_outputs()

    def _close(self) -> None:
        self._drop_outputs()
        super()._close()

    def __str__(self) -> str:
        return f"OperationIterator({describe_op(self._op)})"


class OperationIterDataset(_OperationStage):
    """grain's legacy ``Operation`` (a callable over the iterator of records).

    It keeps no state of its own: a checkpoint holds the positions in the
    sampler's stream, as in grain.
    """

    def __iter__(self) -> DatasetIterator:
        return _OperationIterator(self._parent.__iter__(), self._op)
