"""The grainlike DataLoader that reads a Loadax loader's batches.

A Loadax loader reads the indices of its shard in windows of ``batch_size``,
in order, calls ``dataset.get`` for each (in ``num_workers`` threads, up to
``batch_size * prefetch_factor`` indices ahead), and collates each window's
items with its batch strategy and batcher in the consuming thread. In grainlike
terms: the dataset, seen through the shard's indices, is the source; the
DataLoader's read threads (``ReadOptions``) read it ahead, in order; and a
``Batch`` whose ``batch_fn`` is the Loadax collation runs in the calling thread.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from grainlike.core.samplers import IndexSampler
from grainlike.core.transforms import Batch
from grainlike.dataset.nodes.options import ReadOptions
from grainlike.loader.data_loader import DataLoader

# What a window's collation returns when no item of it loaded: Loadax's
# iterator raises StopIteration for it.
NO_BATCH = object()


@dataclasses.dataclass(frozen=True)
class FailedRead:
    """An exception ``dataset.get(index)`` raised in a read thread."""

    index: Any
    error: Exception


class ShardSource:
    """A Loadax dataset's items at ``indices``, as a grainlike random-access source.

    Args:
      dataset: the Loadax dataset (``get`` and ``len``).
      indices: the dataset indices read, in order.
      catch_errors: return a ``FailedRead`` for an exception of ``get`` (the
        ``Dataloader`` skips such items, as Loadax's does) instead of raising it.
    """

    def __init__(self, dataset: Any, indices: Sequence[int], catch_errors: bool):
        self._dataset = dataset
        self._indices = indices
        self._catch_errors = catch_errors

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, position: int) -> Any:
        index = self._indices[position]
        if not self._catch_errors:
            return self._dataset.get(index)
        try:
            return self._dataset.get(index)
        except Exception as e:  # Loadax reports it and skips the item.
            return FailedRead(index, e)

    def __repr__(self) -> str:
        return f"ShardSource({self._dataset!r}, indices={self._indices!r:.100})"


def batch_loader(source: ShardSource, batch_size: int, collate: Any, threads: int, items_ahead: int) -> DataLoader:
    """A grainlike DataLoader of ``source``'s windows of ``batch_size``, each passed to ``collate``.

    Args:
      source: the records.
      batch_size: records per window; the last window may be shorter.
      collate: ``Batch.batch_fn``: the list of a window's records to its batch.
      threads: read threads (0 reads in the calling thread).
      items_ahead: records read ahead of the consumer.
    """
    return DataLoader(
        data_source=source,
        sampler=IndexSampler(len(source), shuffle=False, num_epochs=1),
        operations=[Batch(batch_size, drop_remainder=False, batch_fn=collate)],
        worker_count=0,
        read_options=ReadOptions(num_threads=threads, prefetch_buffer_size=max(threads, items_ahead)),
    )
