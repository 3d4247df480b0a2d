"""``loadax.dataloader.loader``: a loader that reads ahead in threads."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, TypeVar

from grainlike.compat.loadax.batcher import Batcher
from grainlike.compat.loadax.dataloader.batches import NO_BATCH, FailedRead, ShardSource, batch_loader
from grainlike.compat.loadax.dataloader.naive import NaiveDataloader
from grainlike.compat.loadax.dataloader.progress import Progress
from grainlike.compat.loadax.dataloader.protocol import DataloaderIteratorProtocol
from grainlike.compat.loadax.dataloader.sharding import ShardingStrategy
from grainlike.compat.loadax.strategy import BatchStrategy

DatasetItem = TypeVar("DatasetItem")
Batch = TypeVar("Batch")


@dataclasses.dataclass(frozen=True)
class _Collate:
    """Loadax's batching of one window: loaded items (None and failures skipped), then the batch."""

    loader: "Dataloader"

    def __call__(self, items: list) -> Any:
        strategy = self.loader.strategy
        for item in items:
            if isinstance(item, FailedRead):
                # Loadax's report, printed where it would print it: as the batch is taken.
                print(f"Error loading item at index {item.index}: {item.error}")
            elif item is not None:
                strategy.add(item)
        batch = strategy.batch(force=True)
        return NO_BATCH if batch is None else self.loader.batcher.batch(batch)


class DataloaderIterator(DataloaderIteratorProtocol[DatasetItem, Batch]):
    """Batches of the loader's shard, read ahead by grainlike's read threads.

    Batch ``k`` is made of the shard's indices ``k * batch_size`` to
    ``(k + 1) * batch_size - 1``: the items that loaded (an item that is None is
    left out, and one whose ``get`` raised is reported and left out, as in
    Loadax), collated by the strategy and the batcher in the calling thread. A
    window where no item loaded ends iteration (``StopIteration``), as in
    Loadax. ``iter()`` of the iterator starts it again from the first batch,
    also as in Loadax.

    Attributes:
      dataloader: the loader.
      current_index: shard positions taken so far (a multiple of ``batch_size``).
      shard_indices: the dataset indices this process reads.
      total_indices: their number.
    """

    def __init__(self, dataloader: "Dataloader[DatasetItem, Batch]"):
        self.dataloader = dataloader
        self.shard_indices = dataloader.shard_indices
        self.total_indices = len(self.shard_indices)
        self.current_index = 0
        self._batches: Optional[Any] = None
        self._start()

    def _start(self) -> None:
        self.close()
        self.current_index = 0
        loader = self.dataloader
        if self.total_indices:
            batch_size = loader.strategy.batch_size
            source = ShardSource(loader.dataset, self.shard_indices, catch_errors=True)
            self._batches = iter(batch_loader(source, batch_size, _Collate(loader), threads=loader.num_workers,
                                              items_ahead=batch_size * loader.prefetch_factor))

    def __next__(self) -> Batch:
        if self.current_index >= self.total_indices or self._batches is None:
            raise StopIteration
        self.current_index += self.dataloader.strategy.batch_size
        batch = next(self._batches)
        if batch is NO_BATCH:
            raise StopIteration
        return batch

    def __iter__(self) -> "DataloaderIterator[DatasetItem, Batch]":
        """Starts again from the first batch (Loadax's iterator does too)."""
        self._start()
        return self

    def close(self) -> None:
        """Stops the read threads; the iterator then ends. Dropping the iterator does the same."""
        batches, self._batches = self._batches, None
        if batches is not None:
            batches.close()

    def progress(self) -> Progress:
        """Shard positions taken so far, of the shard's size."""
        return Progress(self.current_index, self.total_indices)


def _check(condition: bool, message: str) -> None:
    # Loadax checks its arguments with assert: the same exception type and text.
    if not condition:
        raise AssertionError(message)


class Dataloader(NaiveDataloader[DatasetItem, Batch]):
    """Batches of a dataset read ahead in ``num_workers`` threads (Loadax's ``Dataloader``).

    Loadax's threads become grainlike's read threads (``ReadOptions(num_threads=
    num_workers)``), reading up to ``batch_size * prefetch_factor`` indices
    ahead, in order; the batch strategy and the batcher run in the calling
    thread. Each process reads its part of the dataset, ``shard_indices``.

    In grainlike's own API: ``grainlike.loader(source).batch(n, batch_fn=fn)
    .read(grainlike.ReadOptions(num_threads=w)).build()``, or worker processes
    with ``.workers(w)``.

    Args:
      dataset: the Loadax dataset.
      batcher: collates each batch's items.
      strategy: how many items make a batch (``FixedBatchStrategy(n)``).
      num_workers: read threads, at least 1.
      prefetch_factor: batches read ahead, at least 1.
      sharding_strategy: which indices each shard reads.
      shard_id: this process's shard; default ``jax.process_index() % num_shards``
        (also when 0 is passed, as in Loadax).
      num_shards: default ``jax.process_count()``; give both or neither.

    Raises:
      AssertionError: an argument out of range, with Loadax's message.
    """

    def __init__(self, dataset: Any, batcher: Batcher[DatasetItem, Batch], strategy: BatchStrategy[DatasetItem],
                 num_workers: int, prefetch_factor: int, sharding_strategy: ShardingStrategy,
                 shard_id: Optional[int] = None, num_shards: Optional[int] = None):
        import jax

        super().__init__(dataset, batcher, strategy)
        _check(num_workers > 0, "num_workers must be at least 1")
        self.num_workers = num_workers
        _check(prefetch_factor > 0, "prefetch_factor must be at least 1")
        self.prefetch_factor = prefetch_factor
        self.sharding_strategy = sharding_strategy
        _check((shard_id is None) == (num_shards is None),
               "Either both shard_id and num_shards must be provided or neither")
        _check(num_shards is None or num_shards > 0, "num_shards must be greater than 0")
        self.num_shards = num_shards or jax.process_count()
        self.shard_id = shard_id or (jax.process_index() % self.num_shards)
        _check(self.shard_id < self.num_shards, f"shard_id {self.shard_id} must be in the range [0, {self.num_shards})")
        self.shard_indices = sharding_strategy.get_shard_indices(
            dataset_size=len(dataset), shard_id=self.shard_id, num_shards=self.num_shards)

    def __iter__(self) -> DataloaderIteratorProtocol[DatasetItem, Batch]:
        return DataloaderIterator(self)
