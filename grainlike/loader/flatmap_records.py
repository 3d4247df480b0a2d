"""A ``FlatMapTransform`` among a DataLoader's operations, as grain 0.2.18 runs it.

Each record is replaced by one record per element ``flat_map(record.data)``
returns, before the operations after it (a ``Batch`` batches the split records).
As in grain, the split records' metadata holds only an index: split ``j`` of the
record at global index ``i`` has index ``i * max_fan_out + j``, no record key and
no rng (a ``RandomMapTransform`` after a flat map gets ``rng=None``).

A loader with a flat map checkpoints as grain's does then: its state is the
Dataset pipeline's own state (``{"parent": ..., "next_index_in_buffer": ...}``
of the flat map, under ``mp_prefetch``'s with workers), not the legacy JSON state.
"""

from __future__ import annotations

from typing import Any, Iterator

from grainlike.core.record import Record, RecordMetadata
from grainlike.dataset.iterator import DatasetIterator
from grainlike.dataset.flatmap import FlatMapIterDataset
from grainlike.loader.stages import _OperationStage, note_record


class _RecordFlatMap:
    """The user's flat map on a record's data, with grain's metadata for each split."""

    def __init__(self, op: Any, position: int):
        self._op = op
        self._position = position
        self.max_fan_out = op.max_fan_out

    def flat_map(self, record: Record) -> Iterator[Record]:
        offset = record.metadata.index * self.max_fan_out
        try:
            splits = list(self._op.flat_map(record.data))
        except Exception as e:
            note_record(e, self._op, record)
            raise
        return [Record(RecordMetadata(index=offset + j), value) for j, value in enumerate(splits)]

    def __repr__(self) -> str:
        return repr(self._op)


class FlatMapRecordsIterDataset(_OperationStage):
    """``operations[position]``, a flat map, on each record (see the module docstring)."""

    def __iter__(self) -> DatasetIterator:
        return FlatMapIterDataset(self._parent, _RecordFlatMap(self._op, self._position)).__iter__()
