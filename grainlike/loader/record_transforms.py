"""A DataLoader's operations on records, as the functions of the Dataset stages that run them.

grain 0.2.18 builds its DataLoader from ``ds.map``, ``ds.filter`` and ``ds.batch``
over ``Record``s, each with a function that applies the operation to a record's
data; so does grainlike (``pipeline.py``). These are those functions
(``ColumnFunction``s: on a chunk of records they read the metadata columns, and
build no ``Record`` per record), and what else only a loader runs: a flat map's
records (grain's metadata for each split) and grain's legacy ``Operation``s.

An error raised by an operation keeps its type and gets a note naming the
operation, the record's global index and its record key.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator, Optional

from grainlike.core import tree
from grainlike.core.errors import add_note
from grainlike.core.protocols import close_if_closeable
from grainlike.core.record import LazyRng, Record, RecordMetadata
from grainlike.core.transforms import Batch, batch_elements, describe_op, get_pretty_transform_name
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.transformations.chunk import ColumnFunction
from grainlike.dataset.transformations.map import PassThroughStateIterator
from grainlike.loader.records import RecordColumns, short_repr


def operation_functions(op: Any) -> tuple:
    """The user's code an operation runs: the transform, or a Batch's ``batch_fn``."""
    if isinstance(op, Batch):
        return () if op.batch_fn is None else (op.batch_fn,)
    return (op,)


def note_transform(error: BaseException, op: Any, index: Optional[int], key: Any = None) -> None:
    """Notes the operation that failed and the record (global index, record key) it failed on."""
    on = "" if index is None else f" on the record at global index {index}"
    add_note(error, f"grainlike: in transform {describe_op(op)}{on}{'' if key is None else f', record_key {key}'}")


class _Operation(ColumnFunction):
    """``operations[position]`` of a DataLoader, as the function of the stage that runs it."""

    def __init__(self, op: Any, position: int):
        self.op = op
        self.position = position
        self.user_functions = operation_functions(op)

    def __repr__(self) -> str:
        # Names the operation when its stage cannot be sent to the workers.
        return f"operations[{self.position}] {get_pretty_transform_name(self.op)}"

    def _failed(self, error: BaseException, meta: Any, i: int) -> None:
        note_transform(error, self.op, meta.indices[i], meta.keys[i])


class _RecordMap(_Operation):
    """A map on each record's data (``ds.map``): ``_map`` on a chunk's columns, or on one record's."""

    def __call__(self, record: Record) -> Record:
        out: list = []
        self.map_columns([record.data], RecordColumns.of([record]), out)
        record.data = out[0]
        return record

    def map_columns(self, values: list, meta: RecordColumns, out: list) -> None:
        try:
            self._map(values, meta, out.append)
        except BaseException as e:  # (sys.exit() too: noted, then raised)
            self._failed(e, meta, len(out))
            raise

    def _map(self, values: list, meta: RecordColumns, append: Callable) -> None:
        raise NotImplementedError


class RecordMap(_RecordMap):
    """A ``MapTransform``."""

    def _map(self, values: list, meta: RecordColumns, append: Callable) -> None:
        fn = self.op.map
        for v in values:
            append(fn(v))


class RecordRandomMap(_RecordMap):
    """A ``RandomMapTransform``, with each record's own rng (built only here)."""

    def _map(self, values: list, meta: RecordColumns, append: Callable) -> None:
        fn, rngs = self.op.random_map, meta.holders()
        if rngs is None:
            for v in values:
                append(fn(v, None))
        elif type(rngs[0]) is LazyRng:
            spare = meta.spare
            for v, holder in zip(values, rngs):
                append(fn(v, holder.build(spare)))
        else:  # Records' own metadata (a grain-protocol sampler's, or one record's).
            for v, m in zip(values, rngs):
                append(fn(v, m.rng))


class RecordMapWithIndex(_RecordMap):
    """A ``MapWithIndexTransform``, with each record's global index."""

    def _map(self, values: list, meta: RecordColumns, append: Callable) -> None:
        fn = self.op.map_with_index
        for g, v in zip(meta.indices, values):
            append(fn(g, v))


class RecordFilter(_Operation):
    """A ``FilterTransform`` on each record's data (``ds.filter``)."""

    def __call__(self, record: Record) -> Any:
        out: list = []
        self.filter_columns([record.data], RecordColumns.of([record]), out)
        return out[0]

    def filter_columns(self, values: list, meta: RecordColumns, out: list) -> None:
        fn, append = self.op.filter, out.append
        try:
            for v in values:
                append(fn(v))
        except BaseException as e:  # (sys.exit() too: noted, then raised)
            self._failed(e, meta, len(out))
            raise


class RecordBatch(_Operation):
    """A ``Batch`` of records (``ds.batch``): their data stacked (or ``batch_fn``), in one record.

    The batch's record has the last record's metadata without its record key,
    as in grain. With ``pad=True`` a short batch is filled up with all-zero
    elements and a ``mask`` leaf says which elements are real; with a padding
    sampler (``padding``), the records it marks as padding are zeroed and masked
    too.

    Args:
      op: the ``Batch``.
      position: its index in the loader's operations.
      padding: the sampler whose padding this Batch masks, or None.
      producer: what made the elements, an operation or a ``Source`` (named
        when their shapes differ).
    """

    def __init__(self, op: Batch, position: int, padding: Any = None, producer: Any = None):
        super().__init__(op, position)
        self.padding = padding if op.pad else None
        self.producer = producer
        self.stacks_values = not op.pad and op.batch_fn is None

    def __call__(self, records: list) -> Record:
        return self.batch_columns(records, None, None, None)

    def batch_columns(self, values: list, meta: Any, stacked: Any, alloc: Optional[tree.Allocator]) -> Record:
        if meta is None:  # Records that came one at a time.
            meta, values = RecordColumns.of(values), [r.data for r in values]
        try:
            data = stacked if stacked is not None else batch_elements(self.op, values, meta.indices, self.padding, alloc)
        except Exception as e:
            note_batch(e, self.op, values, meta.indices, meta.keys, self.producer)
            raise
        return Record(meta.batch_metadata(), data)


class Source:
    """The data source, as what made a Batch's elements."""

    def __init__(self, data_source: Any):
        self.data_source = data_source


def note_batch(error: BaseException, op: Batch, values: list, indices: list, keys: list, producer: Any) -> None:
    """Notes the Batch that failed, its records and those whose structure or shapes differ."""
    add_note(error, f"grainlike: in {describe_op(op)} of the records at global indices {indices} (record_keys {keys})")
    odd = "" if op.batch_fn is not None else odd_elements(values, indices, keys, producer)
    if odd:
        add_note(error, odd)


def odd_elements(values: list, indices: list, keys: list, producer: Any) -> str:
    """Names the records whose structure or shapes differ from the most common one."""
    try:
        specs = [repr(tree.shape_spec(v)) for v in values]
        common, count = collections.Counter(specs).most_common(1)[0]
        if count == len(specs):
            return ""
        if isinstance(producer, Source):
            producer = f"data source {short_repr(producer.data_source)}"
        else:
            producer = f"transform {describe_op(producer)}"
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


class RecordFlatMap:
    """A ``FlatMapTransform`` on each record's data, as grain 0.2.18 runs it (``FlatMapIterDataset``).

    Each record is replaced by one record per element ``flat_map(record.data)``
    returns. As in grain, the split records' metadata holds only an index: split
    ``j`` of the record at global index ``i`` has index ``i * max_fan_out + j``,
    no record key and no rng (a ``RandomMapTransform`` after a flat map gets
    ``rng=None``). A loader with a flat map checkpoints as grain's does then:
    its state is the Dataset pipeline's own state, not the legacy JSON state.
    """

    def __init__(self, op: Any):
        self.__wrapped__ = op  # (Error messages name the user's flat map.)
        self.max_fan_out = op.max_fan_out

    def flat_map(self, record: Record) -> Iterator[Record]:
        op = self.__wrapped__
        offset = record.metadata.index * self.max_fan_out
        try:
            splits = list(op.flat_map(record.data))
        except Exception as e:
            note_transform(e, op, record.metadata.index, record.metadata.record_key)
            raise
        return [Record(RecordMetadata(index=offset + j), value) for j, value in enumerate(splits)]

    def __repr__(self) -> str:
        return repr(self.__wrapped__)


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


class OperationIterDataset(IterDataset):
    """grain's legacy ``Operation`` (a callable over the iterator of records), ``operations[position]``.

    It keeps no state of its own: a checkpoint holds the positions in the
    sampler's stream, as in grain.
    """

    def __init__(self, parent: IterDataset, op: Callable, position: int):
        super().__init__(parent)
        self._op = op
        self._position = position

    def __iter__(self) -> DatasetIterator:
        return _OperationIterator(self._parent.__iter__(), self._op)

    def __str__(self) -> str:
        # Names the operation when the stage cannot be sent to the workers.
        return f"OperationIterDataset(operations[{self._position}] {describe_op(self._op)})"

    def user_transforms(self) -> tuple:
        return (self._op,)
