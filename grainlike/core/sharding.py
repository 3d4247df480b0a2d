"""Which part of the data a process loads."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ShardOptions:
    """Options for splitting the records across processes.

    Attributes:
      shard_index: the shard this process loads, in ``[0, shard_count)``.
      shard_count: how many shards the records are split into.
      drop_remainder: if True every shard gets ``num_records // shard_count``
        records and the rest are dropped; if False the first
        ``num_records % shard_count`` shards take one extra record each.

    Example:
      >>> ShardOptions(shard_index=1, shard_count=4).shard_count
      4
    """

    shard_index: int
    shard_count: int
    drop_remainder: bool = False

    def __post_init__(self):
        for name in ("shard_index", "shard_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if self.shard_count <= 0:
            raise ValueError(
                "Number of shards must be a positive integer but got "
                f"{self.shard_count}."
            )
        if self.shard_index < 0 or self.shard_index >= self.shard_count:
            raise ValueError(
                "Shard shard_index must be in [0, shard_count - 1], shard_count was "
                f"{self.shard_count} and shard_index was {self.shard_index}."
            )


class NoSharding(ShardOptions):
    """Every process loads all records."""

    def __init__(self):
        super().__init__(shard_index=0, shard_count=1, drop_remainder=False)


class ShardByJaxProcess(ShardOptions):
    """One shard per JAX process: ``shard_index = jax.process_index()``.

    jax is imported here, when the options are built, never by ``import grainlike``.
    """

    def __init__(self, drop_remainder: bool = False):
        try:
            import jax  # Lazy: only multi-host users pay for it.

            index, count = jax.process_index(), jax.process_count()
        except ImportError:
            index, count = 0, 1
        super().__init__(shard_index=index, shard_count=count, drop_remainder=drop_remainder)


def even_split(num_records: int, options: ShardOptions) -> tuple[int, int]:
    """Returns ``[start, end)`` of the records that ``options`` selects."""
    per_shard = num_records // options.shard_count
    start = per_shard * options.shard_index
    end = per_shard * (options.shard_index + 1)
    remainder = num_records % options.shard_count
    if remainder and not options.drop_remainder:
        # The first `remainder` shards take one extra record each.
        start += min(options.shard_index, remainder)
        end += min(options.shard_index + 1, remainder)
    return start, end


def strided_shard_size(num_indices: int, options: ShardOptions) -> int:
    """How many of the indices ``0 .. num_indices - 1`` a DataLoader shard reads.

    The DataLoader's shard ``i`` of ``n`` reads the sampler's global indices ``i,
    i + n, i + 2n, ...``. With ``drop_remainder`` every shard reads
    ``num_indices // n`` of them, and the last ``num_indices % n`` indices are
    read by no shard; without it, as grain's main branch (grain 0.2.18 always
    drops them), the first ``num_indices % n`` shards read one index more, so
    every index is read by exactly one shard.

    Example:
      >>> [strided_shard_size(10, ShardOptions(i, 3)) for i in range(3)]
      [4, 3, 3]
      >>> [strided_shard_size(10, ShardOptions(i, 3, drop_remainder=True)) for i in range(3)]
      [3, 3, 3]
    """
    per_shard, remainder = divmod(num_indices, options.shard_count)
    if options.drop_remainder:
        return per_shard
    return per_shard + (1 if options.shard_index < remainder else 0)
