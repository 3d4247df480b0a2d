"""``loadax.dataloader.builder``: a loader configured one call at a time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Optional, TypeVar

from grainlike.compat.loadax.batcher import Batcher
from grainlike.compat.loadax.dataloader.loader import Dataloader
from grainlike.compat.loadax.dataloader.sharding import (
    DistributedShardingStrategy,
    NoShardingStrategy,
    ShardingStrategy,
)
from grainlike.compat.loadax.strategy import BatchStrategy, FixedBatchStrategy

if TYPE_CHECKING:
    from jax.sharding import Mesh

DatasetItem = TypeVar("DatasetItem", covariant=True)
Batch = TypeVar("Batch", covariant=True)


class DataloaderBuilder(Generic[DatasetItem, Batch]):
    """Loadax's builder: ``DataloaderBuilder(batcher).batch_size(n)...build(dataset)``.

    Each method sets its option on this builder and returns it (Loadax's
    builder is mutable: unlike ``grainlike.loader(...)``, whose methods return
    new builders). Loadax's README calls it ``DataLoader``; both names work.

    Example:
      >>> from grainlike.compat.loadax import Batcher, InMemoryDataset
      >>> loader = DataloaderBuilder(Batcher(lambda x: x)).batch_size(2).build(InMemoryDataset([1, 2, 3]))
      >>> list(loader)
      [[1, 2], [3]]

    Attributes:
      batcher: collates each batch's items.
      strategy: the batch strategy; ``FixedBatchStrategy(1)`` if none is set.
      num_workers: read threads (default 1).
      prefetch_factor: batches read ahead (default 2).
      sharding_strategy: which indices each process reads.
      shard_id: this process's shard, or None for ``jax.process_index()``.
      num_shards: the number of shards, or None for ``jax.process_count()``.
    """

    strategy: Optional[BatchStrategy] = None
    num_workers: Optional[int] = 1
    prefetch_factor: Optional[int] = 2
    sharding_strategy: ShardingStrategy = NoShardingStrategy()
    shard_id: Optional[int] = None
    num_shards: Optional[int] = None

    def __init__(self, batcher: Batcher[Any, Batch]):
        self.batcher = batcher

    def batch_size(self, batch_size: int) -> "DataloaderBuilder[DatasetItem, Batch]":
        """Batches of ``batch_size`` items; the last one may be shorter."""
        self.strategy = FixedBatchStrategy(batch_size)
        return self

    def workers(self, num_workers: int) -> "DataloaderBuilder[DatasetItem, Batch]":
        """Read threads (Loadax's workers are threads; grainlike's ``.workers(n)`` are processes)."""
        self.num_workers = num_workers
        return self

    def prefetch(self, factor: int) -> "DataloaderBuilder[DatasetItem, Batch]":
        """Batches read ahead of the consumer (at least 1)."""
        self.prefetch_factor = factor if factor > 0 else 1
        return self

    def shard(self, mesh: "Mesh", data_axis_name: Optional[str] = None, num_shards: Optional[int] = None,
              shard_id: Optional[int] = None) -> "DataloaderBuilder[DatasetItem, Batch]":
        """Each JAX process reads its contiguous part of the dataset; batches combine over ``mesh``.

        The loader's batches are each process's local batches;
        ``loader.sharding_strategy.distribute_global_batch(batch)`` makes the
        global one. ``num_shards`` of 1 or less reads everything in every process.
        """
        if num_shards and num_shards <= 1:
            self.sharding_strategy = NoShardingStrategy()
        else:
            self.sharding_strategy = DistributedShardingStrategy(mesh, data_shard_axis=data_axis_name)
        self.shard_id = shard_id
        self.num_shards = num_shards
        return self

    def build(self, dataset: Any) -> Dataloader[DatasetItem, Batch]:
        """The ``Dataloader`` of ``dataset`` with this configuration."""
        return Dataloader(
            dataset=dataset,
            strategy=self.strategy if self.strategy else FixedBatchStrategy(1),
            batcher=self.batcher,
            num_workers=self.num_workers or 1,
            prefetch_factor=self.prefetch_factor or 1,
            sharding_strategy=self.sharding_strategy,
            shard_id=self.shard_id,
            num_shards=self.num_shards,
        )
