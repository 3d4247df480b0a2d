"""Sampling modes beyond grain's ``IndexSampler``: draws with replacement, padded epochs.

``IndexSampler(..., shuffle=True, num_epochs=n, seed=s)`` already reshuffles every
epoch (epoch ``e`` uses key ``s + e``, as in grain); these two add independent
draws (``RandomSampler``) and epochs padded to whole, masked batches
(``PaddedEpochSampler``). Their checkpoint state is, as for every grainlike
sampler, the index of the next record of each worker.
"""

from __future__ import annotations

import sys
from typing import Optional

import numpy as np

from grainlike.core import sharding
from grainlike.core.errors import check_int
from grainlike.core.samplers import BatchPadding, SampledIndices, _check_epochs_and_seed, _seeds, _ShardSampler

__all__ = ["PaddedEpochSampler", "RandomSampler"]

# SplitMix64 (Steele, Lea & Flood 2014): a counter-based generator whose g-th
# output is mix(state + (g + 1) * GOLDEN).
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def splitmix64(seed: int, indices: np.ndarray) -> np.ndarray:
    """The ``indices``-th outputs (uint64) of a SplitMix64 generator keyed on ``seed``.

    Example:
      >>> splitmix64(0, np.array([0, 1])).dtype
      dtype('uint64')
    """
    with np.errstate(over="ignore"):
        state = _mix64(np.atleast_1d(np.uint64(seed)))
        g = np.asarray(indices, dtype=np.int64).astype(np.uint64)
        return _mix64(state + (g + np.uint64(1)) * _GOLDEN)


class RandomSampler(_ShardSampler):
    """Independent uniform draws with replacement: reproducible and restorable.

    Global index ``g`` reads record ``start + h % shard_size``, where ``h`` is the
    ``g``-th output of a SplitMix64 generator keyed on ``seed`` and ``[start,
    start + shard_size)`` is this process's shard of the records (as
    ``IndexSampler`` splits them). Each draw is a pure function of ``(seed, g)``:
    the stream is the same for every worker count, and a checkpoint holds indices
    only. Random transforms get ``Philox(key=seed + g)``, as with ``IndexSampler``.

    Args:
      num_records: number of records in the data source.
      shard_options: which shard of the records this process draws from.
      num_samples: total draws (over all shards); None draws forever.
        ``num_samples=num_records`` is one "epoch" of the same size as the data.
      seed: the draws' seed, an int in ``[0, 2**32)``.

    Raises:
      ValueError: num_records or num_samples not positive, seed out of range.
      TypeError: seed is not an int.

    Example:
      >>> s = RandomSampler(num_records=10, num_samples=5, seed=0)
      >>> keys = [s[i].record_key for i in range(len(s))]
      >>> keys == [RandomSampler(10, num_samples=5, seed=0)[i].record_key for i in range(5)]
      True
    """

    def __init__(
        self,
        num_records: int,
        shard_options: sharding.ShardOptions = sharding.NoSharding(),
        num_samples: Optional[int] = None,
        seed: int = 0,
    ):
        super().__init__(num_records, shard_options)
        self._num_samples = check_int("num_samples", num_samples, 1, none_ok=True)
        self._seed = check_int("seed", seed, 0, 2**32, type_error=TypeError)

    @property
    def num_samples(self) -> Optional[int]:
        return self._num_samples

    def __len__(self) -> int:
        return sys.maxsize if self._num_samples is None else self._num_samples

    def __repr__(self) -> str:
        return self._describe("RandomSampler", "num_records", "shard_options", "num_samples", "seed")

    def locate(self, indices: np.ndarray) -> SampledIndices:
        """Record keys and rng keys of many global indices at once (vectorised)."""
        indices = np.asarray(indices, dtype=np.int64)
        draws = splitmix64(self._seed, indices.ravel()) % np.uint64(self._check_not_empty())
        keys = draws.astype(np.int64).reshape(indices.shape) + self._start
        return SampledIndices(keys, _seeds(self._seed, indices))


class PaddedEpochSampler(_ShardSampler):
    """``IndexSampler``'s epochs, each padded to whole batches that never mix epochs.

    Each epoch of this shard is ``shard_size`` real records in ``IndexSampler``'s
    order (the same permutation for the same seed and epoch), followed by padding
    up to ``epoch_length``, the next multiple of ``batch_size * max(worker_count,
    1)`` (computed from the largest shard, so every shard yields as many batches).
    A padding position re-reads a real record of the same epoch, so transforms see
    valid input, and ``Batch(batch_size, pad=True)`` zeroes it and sets its
    ``mask`` to False. Every worker's epoch is then a whole number of batches.

    The loader must use ``Batch(batch_size, pad=True)`` with no ``FilterTransform``
    before it, and exactly ``worker_count`` workers; the loader checks this when
    it starts.

    Args:
      num_records: number of records in the data source.
      batch_size: the loader's batch size.
      worker_count: the loader's worker count (0 and 1 are the same here).
      shard_options: which shard of the records this process reads.
      shuffle: a new permutation every epoch (needs a seed).
      num_epochs: number of epochs; None repeats forever.
      seed: seed of the permutations and of the per-record rngs.

    Example:
      >>> s = PaddedEpochSampler(num_records=5, batch_size=4)
      >>> len(s), s.epoch_length, s.batches_per_epoch
      (8, 8, 2)
      >>> s.locate(np.arange(8)).padding.tolist()
      [False, False, False, False, False, True, True, True]
    """

    def __init__(
        self,
        num_records: int,
        batch_size: int,
        *,
        worker_count: int = 0,
        shard_options: sharding.ShardOptions = sharding.NoSharding(),
        shuffle: bool = False,
        num_epochs: Optional[int] = 1,
        seed: Optional[int] = None,
    ):
        super().__init__(num_records, shard_options)
        self._seed = _check_epochs_and_seed(num_epochs, shuffle, seed)
        self._batch_size = check_int("batch_size", batch_size, 1)
        self._worker_count = check_int("worker_count", worker_count)
        self._shuffle = shuffle
        self._num_epochs = num_epochs
        s = shard_options.shard_count
        largest = self._num_records // s
        if self._num_records % s and not shard_options.drop_remainder:
            largest += 1
        multiple = self._batch_size * max(worker_count, 1)
        self._epoch_length = max(1, -(-largest // multiple)) * multiple

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def worker_count(self) -> int:
        return self._worker_count

    @property
    def batch_padding(self) -> BatchPadding:
        """The Batch and worker count this sampler's epochs are padded for."""
        return BatchPadding(self._batch_size, self._worker_count)

    @property
    def epoch_length(self) -> int:
        """Records per epoch in this shard, padding included."""
        return self._epoch_length

    @property
    def batches_per_epoch(self) -> int:
        """Batches the loader yields per epoch (over all its workers)."""
        return self._epoch_length // self._batch_size

    def __len__(self) -> int:
        if self._num_epochs is None:
            return sys.maxsize
        return self._num_epochs * self._epoch_length * self._shard_options.shard_count

    def __repr__(self) -> str:
        return self._describe("PaddedEpochSampler", "num_records", "batch_size", "worker_count",
                              "shard_options", "shuffle", "num_epochs", "seed")

    def locate(self, indices: np.ndarray) -> SampledIndices:
        """Record keys, rng keys and padding flags of many global indices (vectorised)."""
        indices = np.asarray(indices, dtype=np.int64)
        n = self._check_not_empty()
        epochs, pos = np.divmod(indices // self._shard_options.shard_count, self._epoch_length)
        padding = pos >= n
        return SampledIndices(self._keys(pos % n, epochs), _seeds(self._seed, indices), padding)
