"""grain's legacy ``PackAndBatchOperation``: first-fit packing straight into batches.

Each output record holds ``(data, segmentations, positions)``: trees shaped like
the input, with leaves of shape ``(batch_size, length, ...)`` (segmentations and
positions int32); unused rows are zero. Its metadata is the last packed record's,
without the record key. Deprecated in grain, as here (``FirstFitPackIterDataset``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Generic, Iterator, Optional, TypeVar

import numpy as np

from grainlike.core import tree
from grainlike.core.record import Record

__all__ = ["PackAndBatchOperation"]

_T = TypeVar("_T")

_logger = logging.getLogger("grainlike")


def _leaves(op: "PackAndBatchOperation", data: Any) -> list:
    """The leaves of ``data`` at the leaves of ``op.length_struct``."""
    return tree.flatten(tree.map_structure(lambda _, x: x, op.length_struct, data))


class _PackedRows:
    """``batch_size`` rows being filled, first fit."""

    def __init__(self, element: Any, op: "PackAndBatchOperation"):
        self._op = op
        self.caps = tree.flatten(op.length_struct)
        leaves = _leaves(op, element)
        b = op.batch_size
        self.values = [np.zeros((b, cap, *x.shape[1:]), x.dtype) for cap, x in zip(self.caps, leaves)]
        self.segmentations = [np.zeros((b, cap), np.int32) for cap in self.caps]
        self.positions = [np.zeros((b, cap), np.int32) for cap in self.caps]
        self.free = np.zeros((len(self.caps), b), np.int64)
        self.counts = np.zeros(b, np.int64)
        self.metadata: Any = None

    def try_add(self, record: Record) -> bool:
        op = self._op
        leaves = _leaves(op, record.data)
        lengths = np.array([len(x) for x in leaves], np.int64)
        caps = np.asarray(self.caps, np.int64)
        if (lengths > caps).any():
            too_long = {i: (int(lengths[i]), int(caps[i])) for i in np.flatnonzero(lengths > caps)}
            raise ValueError(
                "Inputs to PackAndBatchOperation must be truncated to max length; (length, "
                f"max length) by leaf: {too_long} in record {record.metadata}"
            )
        fits = (self.free + lengths[:, None] <= caps[:, None]).all(axis=0)
        if op.max_sequences_per_bin is not None:
            fits &= self.counts < op.max_sequences_per_bin
        row = int(fits.argmax())
        if not fits[row]:
            return False
        segment_id = self.counts[row] + 1
        for i, value in enumerate(leaves):
            start = int(self.free[i, row])
            end = start + len(value)
            self.values[i][row, start:end] = value
            self.segmentations[i][row, start:end] = segment_id
            self.positions[i][row, start:end] = np.arange(end - start)
            self.free[i, row] = end
        self.counts[row] += 1
        self.metadata = record.metadata.remove_record_key()
        return True

    def record(self) -> Record:
        structure = self._op.length_struct
        return Record(
            self.metadata,
            (
                tree.unflatten_as(structure, self.values),
                tree.unflatten_as(structure, self.segmentations),
                tree.unflatten_as(structure, self.positions),
            ),
        )


@dataclasses.dataclass
class PackAndBatchOperation(Generic[_T]):
    """Packs records first fit into rows of batches (legacy; use ``FirstFitPackIterDataset``).

    Attributes:
      length_struct: a tree like the records' data, with the packed length of
        each leaf; leaves are arrays whose first axis is the sequence.
      batch_size: rows per batch.
      max_sequences_per_bin: at most this many records per row.

    Example:
      >>> from grainlike.core.record import RecordMetadata
      >>> op = PackAndBatchOperation(length_struct={"t": 4}, batch_size=2)
      >>> records = [Record(RecordMetadata(i, i), {"t": np.arange(n) + 1}) for i, n in enumerate((3, 1, 2))]
      >>> data, segmentations, positions = next(op(iter(records))).data
      >>> data["t"].tolist(), segmentations["t"].tolist()
      ([[1, 2, 3, 1], [1, 2, 0, 0]], [[1, 1, 1, 2], [1, 1, 0, 0]])
    """

    length_struct: Any
    batch_size: int
    max_sequences_per_bin: Optional[int] = None

    def __post_init__(self):
        _logger.error(
            "PackAndBatchOperation is deprecated (in grain too). Please use "
            "FirstFitPackIterDataset instead."
        )

    def __call__(self, input_iterator: Iterator[Record]) -> Iterator[Record]:
        rows: Optional[_PackedRows] = None
        for record in input_iterator:
            if rows is None:
                rows = _PackedRows(record.data, self)
            if not rows.try_add(record):
                yield rows.record()
                rows = _PackedRows(record.data, self)
                rows.try_add(record)
        if rows is not None:
            yield rows.record()
