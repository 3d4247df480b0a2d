"""A sampler that reads one slice of every global batch of another sampler.

With a mesh whose data axis spans several JAX processes, the process holding data
shards ``[first, end)`` of ``D`` loads rows ``[first * B // D, end * B // D)`` of
each global batch of ``B`` records; its own ``Batch(rows)`` then makes its part of
each global batch. Records, rngs and ``RecordMetadata.index`` are the wrapped
sampler's, so transforms see what they would see without sharding.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from grainlike.core.errors import check_int
from grainlike.core.record import RecordMetadata
from grainlike.core.samplers import BaseSampler, SampledIndices, _metadata_at, _out_of_range, as_sampler

__all__ = ["BatchSliceSampler"]


class BatchSliceSampler(BaseSampler):
    """Rows ``[first * B // D, end * B // D)`` of every batch of ``B`` positions of ``sampler``.

    Args:
      sampler: the order of the records without sharding (any sampler).
      global_batch_size: ``B``, the records of one global batch.
      num_shards: ``D``, the shards the batch axis is split into; ``B`` must be
        a multiple of it.
      first_shard, end_shard: the shards ``[first, end)`` this process holds.
      drop_remainder: drop a last global batch of fewer than ``B`` records.
        Otherwise its ``r`` records are split the same way (``r // D`` per
        shard), which needs ``r`` to be a multiple of ``D``.

    Raises:
      ValueError: a size that is not a positive int, ``B`` not a multiple of
        ``D``, shards outside ``[0, D)``, or a last batch that does not split
        evenly over the shards, each named with its value.

    Example:
      >>> from grainlike.core.samplers import IndexSampler
      >>> s = BatchSliceSampler(IndexSampler(10, num_epochs=1), 4, 2, 1, 2)
      >>> [s[i].record_key for i in range(len(s))]
      [2, 3, 6, 7, 9]
    """

    def __init__(self, sampler: Any, global_batch_size: int, num_shards: int,
                 first_shard: int, end_shard: int, *, drop_remainder: bool = False):
        self._sampler = as_sampler(sampler)
        if self._sampler.batch_padding is not None:
            raise ValueError(
                f"{self._sampler!r} pads its epochs to whole batches of each process; "
                "a sampler for mesh sharding must not pad (use Batch(..., drop_remainder=True))"
            )
        self._batch = check_int("global_batch_size", global_batch_size, 1)
        self._shards = check_int("num_shards", num_shards, 1)
        if self._batch % self._shards:
            raise ValueError(
                f"global batch size {self._batch} does not split over {self._shards} data "
                f"shards; use a multiple of {self._shards}"
            )
        if not 0 <= first_shard < end_shard <= self._shards:
            raise ValueError(
                f"shards [{first_shard}, {end_shard}) must lie within [0, {self._shards})"
            )
        self._first, self._end = int(first_shard), int(end_shard)
        self._rows = (self._end - self._first) * self._batch // self._shards
        self._offset = self._first * self._batch // self._shards
        self._drop_remainder = bool(drop_remainder)
        total = len(self._sampler)
        if total == sys.maxsize:
            self._full, self._last_rows, self._last_offset = sys.maxsize // self._batch, 0, 0
            self._length = sys.maxsize
            return
        self._full, remainder = divmod(total, self._batch)
        if drop_remainder:
            remainder = 0
        if remainder % self._shards:
            raise ValueError(
                f"the last global batch holds {remainder} of the {total} records "
                f"({total} % {self._batch}), which do not split evenly over {self._shards} "
                "data shards; use Batch(..., drop_remainder=True) or a record count whose "
                f"remainder is a multiple of {self._shards}"
            )
        self._last_rows = (self._end - self._first) * remainder // self._shards
        self._last_offset = self._first * remainder // self._shards
        self._length = self._full * self._rows + self._last_rows

    @property
    def rows(self) -> int:
        """The rows of each full global batch this sampler reads."""
        return self._rows

    @property
    def last_rows(self) -> int:
        """The rows it reads of a last, shorter global batch (0 if there is none)."""
        return self._last_rows

    def __len__(self) -> int:
        return self._length

    def global_positions(self, indices: np.ndarray) -> np.ndarray:
        """The wrapped sampler's positions of this sampler's ``indices``."""
        indices = np.asarray(indices, dtype=np.int64)
        batch, row = np.divmod(indices, self._rows)
        out = batch * self._batch + self._offset + row
        last = batch >= self._full
        if last.any():
            row_in_last = indices[last] - self._full * self._rows
            out[last] = self._full * self._batch + self._last_offset + row_in_last
        return out

    def locate(self, indices: np.ndarray) -> SampledIndices:
        positions = self.global_positions(indices)
        located = self._sampler.locate(positions)
        if located.metadata is not None:
            return located  # A grain-protocol sampler's own metadata, its index included.
        # A record's index is its position in the order without sharding
        # (MapWithIndex sees what it sees there).
        return located._replace(indices=positions if located.indices is None else located.indices)

    def __getitem__(self, index: int) -> RecordMetadata:
        index = int(index)
        if index < 0 or index >= self._length:
            raise _out_of_range(index, self._length)
        return _metadata_at(self.locate(np.array([index], np.int64)), index)

    def __repr__(self) -> str:
        # The state of a loader names its sampler: a restore onto another
        # process's slice, batch size or order is refused by the comparison.
        return (
            f"BatchSliceSampler({self._sampler!r}, global_batch_size={self._batch}, "
            f"shards={self._first}:{self._end} of {self._shards}, "
            f"drop_remainder={self._drop_remainder})"
        )
