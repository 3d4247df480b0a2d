"""``loadax.dataloader.naive``: a loader that reads in the calling thread."""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, Optional, TypeVar

from grainlike.compat.loadax.batcher import Batcher
from grainlike.compat.loadax.dataloader.batches import NO_BATCH, ShardSource, batch_loader
from grainlike.compat.loadax.dataloader.progress import Progress
from grainlike.compat.loadax.dataloader.protocol import DataloaderIteratorProtocol, DataloaderProtocol
from grainlike.compat.loadax.strategy import BatchStrategy

DatasetItem = TypeVar("DatasetItem")
Batch = TypeVar("Batch")


@dataclasses.dataclass
class _Cursor:
    """An iterator's position, shared with the collation that advances it."""

    items_read: int = 0
    ended: bool = False


@dataclasses.dataclass(frozen=True)
class _NaiveCollate:
    """Loadax's naive batching of one window: items up to the first None, then the batch."""

    loader: "NaiveDataloader"
    cursor: _Cursor

    def __call__(self, items: list) -> Any:
        strategy = self.loader.strategy
        for item in items:
            if item is None:  # Loadax's naive loader stops at the first missing item.
                self.cursor.ended = True
                break
            self.cursor.items_read += 1
            strategy.add(item)
        batch = strategy.batch(force=True)
        return NO_BATCH if batch is None else self.loader.batcher.batch(batch)


class NaiveDataloaderIterator(DataloaderIteratorProtocol[DatasetItem, Batch]):
    """Batches of ``dataset.get(0)``, ``get(1)``, ... read in the calling thread.

    Reading stops at ``len(dataset)`` or at the first item that is None,
    whichever comes first (Loadax's stops at the first None only).

    Attributes:
      dataloader: the loader.
    """

    def __init__(self, dataloader: "NaiveDataloader[DatasetItem, Batch]"):
        self.dataloader = dataloader
        self._cursor = _Cursor()
        self._batches: Optional[Any] = None
        size = len(dataloader.dataset)
        if size:
            source = ShardSource(dataloader.dataset, range(size), catch_errors=False)
            batch_size = dataloader.strategy.batch_size
            collate = _NaiveCollate(dataloader, self._cursor)
            self._batches = iter(batch_loader(source, batch_size, collate, threads=0, items_ahead=batch_size))

    @property
    def current_index(self) -> int:
        """The number of items read into batches so far."""
        return self._cursor.items_read

    def __next__(self) -> Batch:
        if self._batches is None or self._cursor.ended:
            raise StopIteration
        batch = next(self._batches)
        if batch is NO_BATCH:
            raise StopIteration
        return batch

    def __iter__(self) -> "NaiveDataloaderIterator[DatasetItem, Batch]":
        return self

    def progress(self) -> Progress:
        """Items read so far, of ``len(dataset)``."""
        return Progress(self.current_index, len(self.dataloader.dataset))


class NaiveDataloader(DataloaderProtocol[DatasetItem, Batch], Generic[DatasetItem, Batch]):
    """Batches read in the calling thread, with no read-ahead threads.

    In grainlike's own API: ``grainlike.DataLoader(..., worker_count=0)`` or
    ``grainlike.loader(source).batch(n, batch_fn=fn).build()``.

    Args:
      dataset: the Loadax dataset.
      batcher: collates each batch's items.
      strategy: how many items make a batch (``FixedBatchStrategy(n)``).
    """

    def __init__(self, dataset: Any, batcher: Batcher[DatasetItem, Batch], strategy: BatchStrategy[DatasetItem]):
        self.dataset = dataset
        self.batcher = batcher
        self.strategy = strategy

    def num_items(self) -> int:
        """``len(dataset)``."""
        return len(self.dataset)

    def num_batches(self) -> int:
        """``num_items() // batch_size``: full batches only, as Loadax counts."""
        return self.num_items() // self.strategy.batch_size

    def __len__(self) -> int:
        return self.num_batches()

    def __iter__(self) -> DataloaderIteratorProtocol[DatasetItem, Batch]:
        return NaiveDataloaderIterator(self)
