"""Samplers: which record each global index reads, and with which rng.

``IndexSampler`` reproduces grain 0.2.18's record order exactly (see "Sampler"
in ``docs/concepts.md``; the tests compare it with grain's own outputs in
``tests/data/index_sampler_vectors.json``): global index -> shard-local position
-> epoch and position in epoch -> keyed permutation -> record key.
"""

from __future__ import annotations

import sys
from typing import Optional, Protocol, runtime_checkable

import numpy as np

from grainlike.core import sharding
from grainlike.core.index_shuffle import index_shuffle
from grainlike.core.record import LazyRng, RecordMetadata

# The permutation rounds grain uses for its global shuffle.
_SHUFFLE_ROUNDS = 4


@runtime_checkable
class Sampler(Protocol):
    """Anything that maps a global index to a ``RecordMetadata``."""

    def __getitem__(self, index: int) -> RecordMetadata:
        """Returns the metadata of the record at global ``index``."""


def _out_of_range(index: int, max_index: Optional[int]) -> IndexError:
    return IndexError(
        f"RecordMetadata object index is out of bounds; Got index {index},"
        f" allowed indices should be in [0, {max_index}]"
    )


class EmptyShardError(ZeroDivisionError, ValueError):
    """This process's shard holds no records (more shards than records).

    A ZeroDivisionError, as grain raises, and a ValueError, as the cause is a bad
    argument.
    """


def _check_num_records(num_records: object) -> None:
    if isinstance(num_records, bool) or not isinstance(num_records, (int, np.integer)):
        raise TypeError(f"num_records must be an int, got {num_records!r}")
    if num_records <= 0:
        raise ValueError(
            "Invalid number of records in Sampler. "
            f"Got {num_records} records, but number of records "
            "must be greater than 0."
        )


class SequentialSampler:
    """Reads records ``0, 1, 2, ...`` once, in order.

    Args:
      num_records: number of records in the data source.
      shard_options: which shard this process reads (only used for its length).
      seed: if given, each record gets ``Philox(key=seed + index)`` as rng.
    """

    def __init__(
        self,
        num_records: int,
        shard_options: sharding.ShardOptions = sharding.NoSharding(),
        seed: Optional[int] = None,
    ):
        _check_num_records(num_records)
        self._num_records = int(num_records)
        self._shard_options = shard_options
        if shard_options.drop_remainder:
            per_shard = self._num_records // shard_options.shard_count
            self._max_index = per_shard * shard_options.shard_count
        else:
            self._max_index = self._num_records
        self._seed = seed

    @property
    def seed(self) -> Optional[int]:
        return self._seed

    def __len__(self) -> int:
        return self._max_index

    def __repr__(self) -> str:
        return (
            f"SequentialSampler(num_records={self._num_records}, "
            f"shard_options={self._shard_options!r})"
        )

    def __getitem__(self, index: int) -> RecordMetadata:
        if index < 0 or index >= self._max_index:
            raise _out_of_range(index, self._max_index)
        rng = None if self._seed is None else LazyRng(self._seed + index)
        return RecordMetadata(index=index, record_key=index, rng=rng)

    def record_keys(self, indices: np.ndarray) -> np.ndarray:
        """Record keys of many in-range global indices at once."""
        return np.asarray(indices, dtype=np.int64)


class IndexSampler:
    """Shards, shuffles and repeats the records of one data source.

    Produces exactly grain 0.2.18's order for the same arguments, so a pipeline
    moved from grain reads the same records in the same order.

    Args:
      num_records: number of records in the data source.
      shard_options: which shard of the records this process reads.
      shuffle: shuffle globally, with a new permutation every epoch.
      num_epochs: how many times to go over the records; None repeats forever.
      seed: seed of the permutation and of the per-record rngs, in [0, 2**32).

    Raises:
      ValueError: num_records or num_epochs not positive, shuffle without a
        seed, or a seed outside [0, 2**32).
      TypeError: shuffle with a seed that is not an int.

    Example:
      >>> s = IndexSampler(num_records=5, shuffle=True, num_epochs=1, seed=0)
      >>> sorted(s[i].record_key for i in range(len(s)))
      [0, 1, 2, 3, 4]
    """

    def __init__(
        self,
        num_records: int,
        shard_options: sharding.ShardOptions = sharding.NoSharding(),
        shuffle: bool = False,
        num_epochs: Optional[int] = None,
        seed: Optional[int] = None,
    ):
        _check_num_records(num_records)
        if num_epochs is not None and num_epochs <= 0:
            raise ValueError(
                "Invalid number of epochs in Index Sampler."
                f"Got {num_epochs} epochs, but number of epochs "
                "must be greater than 0."
            )
        if shuffle and seed is None:
            raise ValueError("Shuffling requires specifying a seed.")
        if shuffle and not isinstance(seed, int):
            raise TypeError(f"Expected seed of int type. Got seed with type {type(seed)}")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise TypeError(f"seed must be an int in [0, 2**32), got {seed!r}")
            if seed < 0 or int(seed).bit_length() > 32:
                raise ValueError(
                    f"Seed should be positive 32-bit integer: seed must be an int in "
                    f"[0, 2**32), got {seed}."
                )
            seed = int(seed)
        self._num_records = int(num_records)
        self._shard_options = shard_options
        self._shuffle = shuffle
        self._num_epochs = num_epochs
        self._seed = seed
        self._start, self._end = sharding.even_split(self._num_records, shard_options)
        self._shard_size = self._end - self._start
        self._max_index = None if num_epochs is None else num_epochs * self._num_records
        if (
            self._max_index is not None
            and shard_options.drop_remainder
            and not isinstance(shard_options, sharding.NoSharding)
        ):
            self._max_index = min(
                self._max_index, self._shard_size * shard_options.shard_count * num_epochs
            )

    @property
    def seed(self) -> Optional[int]:
        return self._seed

    @property
    def num_records(self) -> int:
        return self._num_records

    @property
    def shard_options(self) -> sharding.ShardOptions:
        return self._shard_options

    @property
    def shuffle(self) -> bool:
        return self._shuffle

    @property
    def num_epochs(self) -> Optional[int]:
        return self._num_epochs

    def __len__(self) -> int:
        return sys.maxsize if self._max_index is None else self._max_index

    def __repr__(self) -> str:
        return (
            f"IndexSampler(num_records={self._num_records}, "
            f"shard_options={self._shard_options!r}, "
            f"shuffle={self._shuffle}, "
            f"num_epochs={self._num_epochs}, "
            f"seed={self._seed})"
        )

    def _key(self, index: int) -> int:
        n = self._shard_size
        if n <= 0:
            raise EmptyShardError(
                f"Shard {self._shard_options.shard_index} of "
                f"{self._shard_options.shard_count} holds no records "
                f"(num_records={self._num_records})."
            )
        epoch, i = divmod(index // self._shard_options.shard_count, n)
        if self._shuffle:
            i = index_shuffle(i, n - 1, (self._seed + epoch) % 2**32, _SHUFFLE_ROUNDS)
        return self._start + i

    def __getitem__(self, index: int) -> RecordMetadata:
        if index < 0 or (self._max_index is not None and index >= self._max_index):
            raise _out_of_range(index, self._max_index)
        rng = None if self._seed is None else LazyRng(self._seed + index)
        return RecordMetadata(index=index, record_key=self._key(index), rng=rng)

    def record_keys(self, indices: np.ndarray) -> np.ndarray:
        """Record keys of many in-range global indices at once (vectorised).

        Args:
          indices: int64 array of global indices, each in ``[0, len(self))``.

        Returns:
          int64 array of the same shape: ``self[i].record_key`` for each ``i``.
        """
        indices = np.asarray(indices, dtype=np.int64)
        n = self._shard_size
        if n <= 0 and indices.size:
            self._key(0)  # raises EmptyShardError
        if n <= 0:
            return indices.copy()
        local = indices // self._shard_options.shard_count
        epochs, pos = np.divmod(local, n)
        if self._shuffle:
            out = np.empty_like(pos)
            # Each epoch has its own permutation; a chunk spans one or two epochs.
            for epoch in np.unique(epochs):
                sel = epochs == epoch
                out[sel] = index_shuffle(
                    pos[sel], n - 1, (self._seed + int(epoch)) % 2**32, _SHUFFLE_ROUNDS
                )
            pos = out
        return pos + self._start
