"""``loadax.dataloader.sharding``: which indices a process reads, and global batches.

The split is grainlike's (``ShardOptions`` and ``even_split``): contiguous
parts, the first ``len % num_shards`` one item longer, as Loadax's. Global
batches are assembled by ``grainlike.make_global_batch``.
"""

from __future__ import annotations

import abc
import operator
from typing import TYPE_CHECKING, Any, Optional

from grainlike.core.sharding import ShardOptions, even_split

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh


class ShardingStrategy(abc.ABC):
    """Which indices of a dataset a shard (JAX process) reads, and how batches combine.

    Attributes:
      mesh: the mesh global batches are laid out on, or None.
      data_axis: the mesh axis the batch dimension is split over, or None.
    """

    mesh: Optional["Mesh"] = None
    data_axis: Optional[str] = None

    @abc.abstractmethod
    def get_shard_indices(self, dataset_size: int, shard_id: int, num_shards: int) -> range:
        """The dataset indices shard ``shard_id`` of ``num_shards`` reads."""

    @abc.abstractmethod
    def needs_sharding(self) -> bool:
        """Whether shards read different indices."""

    @abc.abstractmethod
    def distribute_global_batch(self, local_batch: Any, *, data_axis: Optional[str] = None) -> Any:
        """The global batch made of every process's ``local_batch``."""

    def named_sharding(self, *names: Optional[str]) -> "jax.sharding.NamedSharding":
        """``NamedSharding(self.mesh, PartitionSpec(*names))``."""
        import jax

        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(*names))


class NoShardingStrategy(ShardingStrategy):
    """Every process reads every index; a local batch is already the global one."""

    def get_shard_indices(self, dataset_size: int, shard_id: int, num_shards: int) -> range:
        """All indices, whatever the shard."""
        return range(dataset_size)

    def needs_sharding(self) -> bool:
        """False."""
        return False

    def distribute_global_batch(self, local_batch: Any, *, data_axis: Optional[str] = None) -> Any:
        """``local_batch`` itself."""
        return local_batch


class DistributedShardingStrategy(ShardingStrategy):
    """Each process reads its contiguous part of the dataset; batches combine over ``mesh``.

    In grainlike's own API: ``.shard(mesh, data_axis=...)`` on the builder, whose
    batches arrive as global arrays (each process reading its rows of each global
    batch), or ``ShardByJaxProcess()`` and ``grainlike.make_global_batch``.

    Args:
      mesh: the mesh global batches are laid out on.
      data_shard_axis: the mesh axis the batch dimension is split over; else
        ``distribute_global_batch`` needs ``data_axis=``.
    """

    def __init__(self, mesh: "Mesh", data_shard_axis: Optional[str] = None):
        self.mesh = mesh
        self.data_axis = data_shard_axis

    def get_shard_indices(self, dataset_size: int, shard_id: int, num_shards: int) -> range:
        """Shard ``shard_id``'s contiguous part of ``range(dataset_size)``; all of it for one shard.

        Raises:
          ValueError: ``shard_id`` outside ``[0, num_shards)``.
        """
        if num_shards <= 1:
            return range(dataset_size)
        start, end = even_split(dataset_size, ShardOptions(operator.index(shard_id), operator.index(num_shards)))
        return range(start, end)

    def needs_sharding(self) -> bool:
        """True."""
        return True

    def distribute_global_batch(self, local_batch: Any, *, data_axis: Optional[str] = None) -> Any:
        """Every process's ``local_batch``, concatenated in process order, as a global ``jax.Array``.

        Each process calls it with its own batch (all of the same size); the
        result is laid out ``NamedSharding(mesh, PartitionSpec(data_axis))`` and
        no data moves between processes (``grainlike.make_global_batch``). In
        a single process it is ``jax.numpy.asarray`` of each leaf, as in
        Loadax: on the default device, for any batch size. A pytree of arrays
        works too (Loadax takes one array).

        Raises:
          ValueError: no data axis, here or at construction.
        """
        import jax

        data_axis = data_axis or self.data_axis
        if not data_axis:
            raise ValueError("data_axis must be provided when using distribute_global_batch")
        if jax.process_count() == 1:
            return jax.tree.map(jax.numpy.asarray, local_batch)
        from grainlike.jax.device_iterator import make_global_batch

        return make_global_batch(local_batch, self.named_sharding(data_axis))
