"""``load()``: grain's one-call pipeline over a data source."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from grainlike.core import sharding
from grainlike.core.samplers import IndexSampler
from grainlike.core.transforms import Batch
from grainlike.loader.data_loader import DataLoader
from grainlike.dataset.nodes.options import ReadOptions


def load(
    source: Any,
    *,
    num_epochs: Optional[int] = None,
    shuffle: bool = False,
    seed: Optional[int] = None,
    shard_options: sharding.ShardOptions = sharding.NoSharding(),
    transformations: Sequence[Any] = (),
    batch_size: Optional[int] = None,
    drop_remainder: bool = False,
    worker_count: Optional[int] = 0,
    read_options: Optional[ReadOptions] = None,
) -> DataLoader:
    """A DataLoader over ``source`` with an ``IndexSampler`` and optional batching.

    Args:
      source: random-access data source.
      num_epochs: passes over the data; None repeats forever (see ``IndexSampler``).
      shuffle: shuffle the records of each epoch (see ``IndexSampler``).
      seed: seed of the shuffle and of the records' rngs (see ``IndexSampler``).
      shard_options: which shard of the records this process loads.
      transformations: transforms applied to each record.
      batch_size: if given, a ``Batch(batch_size, drop_remainder)`` is appended.
      drop_remainder: drop a final partial batch.
      worker_count: worker processes (0: in process).
      read_options: see ``ReadOptions``.

    Example:
      >>> import grainlike as grain
      >>> loader = grain.load(grain.RangeDataSource(0, 6, 1), num_epochs=1, batch_size=4)
      >>> [b.tolist() for b in loader]
      [[0, 1, 2, 3], [4, 5]]
    """
    sampler = IndexSampler(
        num_records=len(source),
        shuffle=shuffle,
        seed=seed,
        num_epochs=num_epochs,
        shard_options=shard_options,
    )
    ops = list(transformations)
    if batch_size is not None:
        ops.append(Batch(batch_size, drop_remainder=drop_remainder))
    return DataLoader(
        data_source=source,
        sampler=sampler,
        operations=ops,
        worker_count=worker_count,
        read_options=read_options,
    )
