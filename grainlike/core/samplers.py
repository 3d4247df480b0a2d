"""Samplers: which record each global index reads, and with which rng.

``IndexSampler`` reproduces grain 0.2.18's record order exactly (see "Sampler"
in ``docs/concepts.md``; ``tests/data/index_sampler_vectors.json`` holds grain's
outputs). The loader asks a sampler about many global indices at once:
``sampler.locate(indices)`` returns a ``SampledIndices``; grain's protocol,
``sampler[index] -> RecordMetadata``, follows from it. A sampler written for
grain, with ``__getitem__`` only, is wrapped once by ``as_sampler``.
"""

from __future__ import annotations

import abc
import dataclasses
import operator
import sys
from collections.abc import Sized
from typing import Any, NamedTuple, Optional, Protocol, runtime_checkable

import numpy as np

from grainlike.core import sharding
from grainlike.core.errors import EmptyShardError, check_int, is_int
from grainlike.core.index_shuffle import index_shuffle
from grainlike.core.record import LazyRng, RecordMetadata

# The permutation rounds grain uses for its global shuffle.
_SHUFFLE_ROUNDS = 4


@runtime_checkable
class Sampler(Protocol):
    """Anything that maps a global index to a ``RecordMetadata``."""

    def __getitem__(self, index: int) -> RecordMetadata:
        """Returns the metadata of the record at global ``index``."""


class SampledIndices(NamedTuple):
    """What a sampler says about a run of global indices (``BaseSampler.locate``).

    Attributes:
      keys: the record key to read for each index (int64; an object array for a
        wrapped sampler whose keys are not ints).
      seeds: for each index, the key of the record's rng,
        ``np.random.Generator(np.random.Philox(key=seed))`` (uint64); None when
        the records get no rng.
      padding: True where the position is padding that ``Batch(..., pad=True)``
        masks; None when no position is. Only samplers with ``batch_padding``
        return it.
      metadata: the ``RecordMetadata`` of each index as a sampler wrapped by
        ``as_sampler`` made it (used as it is); None for grainlike's samplers.
      indices: the ``RecordMetadata.index`` of each position (int64), where it
        is not the global index asked for (``BatchSliceSampler``); None otherwise.
    """

    keys: np.ndarray
    seeds: Optional[np.ndarray] = None
    padding: Optional[np.ndarray] = None
    metadata: Optional[list] = None
    indices: Optional[np.ndarray] = None


@dataclasses.dataclass(frozen=True)
class BatchPadding:
    """How a padding sampler's epochs line up with batches.

    Attributes:
      batch_size: the ``Batch(batch_size, pad=True)`` that masks the padding.
      worker_count: the loader's worker count the epochs are laid out for.
    """

    batch_size: int
    worker_count: int


def _out_of_range(index: int, max_index: Optional[int]) -> IndexError:
    return IndexError(
        f"RecordMetadata object index is out of bounds; Got index {index},"
        f" allowed indices should be in [0, {max_index}]"
    )


def _check_num_records(num_records: object) -> None:
    if not is_int(num_records):
        raise TypeError(f"num_records must be an int, got {num_records!r}")
    if num_records <= 0:
        raise ValueError(
            "Invalid number of records in Sampler. "
            f"Got {num_records} records, but number of records "
            "must be greater than 0."
        )


def _check_epochs_and_seed(num_epochs: Optional[int], shuffle: bool, seed: Optional[int]) -> Optional[int]:
    """``IndexSampler``'s checks of its other arguments, with grain's messages; returns the seed."""
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
    if seed is None:
        return None
    try:
        return check_int("seed", seed, 0, 2**32, type_error=TypeError)
    except ValueError as e:  # grain's words first
        raise ValueError(f"Seed should be positive 32-bit integer: {e}.") from None


def _seeds(seed: Optional[int], indices: np.ndarray) -> Optional[np.ndarray]:
    """Each record's rng key, ``seed + index`` as grain computes it (uint64)."""
    if seed is None:
        return None
    return indices.astype(np.uint64) + np.uint64(seed)


def _permute(positions: np.ndarray, epochs: np.ndarray, n: int, seed: int) -> np.ndarray:
    """grain's shuffle: position ``i`` of epoch ``e`` goes to ``index_shuffle(i, n - 1, seed + e)``."""
    out = np.empty_like(positions)
    if positions.size == 0:
        return out
    # Each epoch has its own permutation; a chunk spans one or two epochs. The
    # common case, one epoch, without np.unique: it imports numpy.ma (~15 ms), in
    # every new worker before its first batch.
    first, last = int(epochs.min()), int(epochs.max())
    for epoch in [first] if first == last else np.unique(epochs).tolist():
        sel = epochs == epoch
        out[sel] = index_shuffle(positions[sel], n - 1, (seed + epoch) % 2**32, _SHUFFLE_ROUNDS)
    return out


def _metadata_at(located: SampledIndices, index: int) -> RecordMetadata:
    """The ``RecordMetadata`` of the one global ``index`` that ``located`` describes."""
    if located.metadata is not None:
        return located.metadata[0]
    rng = None if located.seeds is None else LazyRng(int(located.seeds[0]))
    if located.indices is not None:
        index = int(located.indices[0])
    return RecordMetadata(index=index, record_key=int(located.keys[0]), rng=rng)


class BaseSampler(abc.ABC):
    """The sampler contract: many global indices located at once.

    Subclasses implement ``__len__`` and ``locate``; ``__getitem__`` (grain's
    ``Sampler`` protocol) follows from them. A sampler whose epochs are padded to
    whole batches sets ``batch_padding``.
    """

    #: Set by samplers whose ``locate`` returns padding; the loader then checks
    #: that its operations mask it (see ``BatchPadding``).
    batch_padding: Optional[BatchPadding] = None

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of global indices; ``sys.maxsize`` when the sampler never ends."""

    @abc.abstractmethod
    def locate(self, indices: np.ndarray) -> SampledIndices:
        """A ``SampledIndices`` of the int64 global ``indices`` (each in ``[0, len(self))``), of their shape."""

    def __getitem__(self, index: int) -> RecordMetadata:
        """The ``RecordMetadata`` of global ``index`` (grain's ``Sampler`` protocol).

        Raises:
          IndexError: ``index`` is negative or past the end, as in grain.
        """
        index = operator.index(index)
        bound = len(self)
        bound = None if bound == sys.maxsize else bound
        if index < 0 or (bound is not None and index >= bound):
            raise _out_of_range(index, bound)
        return _metadata_at(self.locate(np.array([index], np.int64)), index)


class _GrainProtocolSampler(BaseSampler):
    """A sampler with grain's ``__getitem__ -> RecordMetadata`` only, one index at a time."""

    def __init__(self, sampler: Any):
        self.sampler = sampler
        self._size: Optional[int] = None

    def __len__(self) -> int:
        if self._size is None:
            self._size = _size_by_probing(self.sampler)
        return self._size

    def locate(self, indices: np.ndarray) -> SampledIndices:
        sampler = self.sampler
        metadata = [sampler[i] for i in np.asarray(indices).tolist()]
        keys = [m.record_key for m in metadata]
        try:
            key_array = np.array(keys, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            key_array = np.array(keys, dtype=object)
        return SampledIndices(key_array, None, None, metadata)

    def __getitem__(self, index: int) -> RecordMetadata:
        return self.sampler[index]

    def __repr__(self) -> str:
        return repr(self.sampler)


def _size_by_probing(sampler: Any) -> int:
    """``len(sampler)``, or the first index it refuses (by bisection) if it has no len."""
    if isinstance(sampler, Sized):
        return len(sampler)
    lo, hi = 0, sys.maxsize
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            sampler[mid]
            lo = mid + 1
        except IndexError:
            hi = mid
    return lo


def as_sampler(sampler: Any) -> BaseSampler:
    """``sampler`` as the loader uses it: a ``BaseSampler``, wrapped once if needed.

    Any object with grain's ``__getitem__(index) -> RecordMetadata`` (and optionally
    ``__len__``) is wrapped; ``locate`` then asks it one index at a time and uses its
    metadata unchanged.

    Raises:
      TypeError: ``sampler`` has no ``__getitem__``.
    """
    if isinstance(sampler, BaseSampler):
        return sampler
    if not isinstance(sampler, Sampler):
        raise TypeError(
            f"sampler must map a global index to a RecordMetadata (grain's Sampler "
            f"protocol: __getitem__), got {type(sampler).__name__}: {sampler!r:.120}"
        )
    return _GrainProtocolSampler(sampler)


class _ShardSampler(BaseSampler):
    """A sampler of this shard's records ``[_start, _start + _shard_size)`` of ``num_records``."""

    _seed: Optional[int] = None
    _shuffle = False

    def __init__(self, num_records: int, shard_options: sharding.ShardOptions):
        _check_num_records(num_records)
        self._num_records = int(num_records)
        self._shard_options = shard_options
        self._start, end = sharding.even_split(self._num_records, shard_options)
        self._shard_size = end - self._start
        # The records all shards read per epoch: drop_remainder drops the rest.
        kept = self._shard_size * shard_options.shard_count
        self._epoch_records = kept if shard_options.drop_remainder else self._num_records

    @property
    def seed(self) -> Optional[int]:
        return self._seed

    @property
    def num_records(self) -> int:
        return self._num_records

    @property
    def shard_options(self) -> sharding.ShardOptions:
        return self._shard_options

    def _describe(self, name: str, *fields: str) -> str:
        """``name(field=value, ...)`` of the attributes ``_<field>``: the loader's state names it."""
        values = ", ".join(f"{f}={getattr(self, '_' + f)}" for f in fields)
        return f"{name}({values})"

    def _check_not_empty(self) -> int:
        """The shard's size; ``EmptyShardError`` naming the shard if it holds no records."""
        if self._shard_size <= 0:
            options = self._shard_options
            raise EmptyShardError(
                f"Shard {options.shard_index} of {options.shard_count} holds no "
                f"records (num_records={self._num_records})."
            )
        return self._shard_size

    def _keys(self, positions: np.ndarray, epochs: np.ndarray) -> np.ndarray:
        """The record keys of positions in their epochs' order (shuffled if the sampler shuffles)."""
        if self._shuffle:
            positions = _permute(positions, epochs, self._shard_size, self._seed)
        return positions + self._start


class SequentialSampler(_ShardSampler):
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
        super().__init__(num_records, shard_options)
        self._max_index = self._epoch_records
        self._seed = seed

    def __len__(self) -> int:
        return self._max_index

    def __repr__(self) -> str:
        return self._describe("SequentialSampler", "num_records", "shard_options")

    def __getitem__(self, index: int) -> RecordMetadata:
        if index < 0 or index >= self._max_index:
            raise _out_of_range(index, self._max_index)
        rng = None if self._seed is None else LazyRng(self._seed + index)
        return RecordMetadata(index=index, record_key=index, rng=rng)

    def locate(self, indices: np.ndarray) -> SampledIndices:
        indices = np.asarray(indices, dtype=np.int64)
        return SampledIndices(indices, _seeds(self._seed, indices))


class IndexSampler(_ShardSampler):
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
        super().__init__(num_records, shard_options)
        self._seed = _check_epochs_and_seed(num_epochs, shuffle, seed)
        self._shuffle = shuffle
        self._num_epochs = num_epochs
        self._max_index = None if num_epochs is None else num_epochs * self._epoch_records

    @property
    def shuffle(self) -> bool:
        return self._shuffle

    @property
    def num_epochs(self) -> Optional[int]:
        return self._num_epochs

    def __len__(self) -> int:
        return sys.maxsize if self._max_index is None else self._max_index

    def __repr__(self) -> str:
        return self._describe("IndexSampler", "num_records", "shard_options", "shuffle", "num_epochs", "seed")

    def __getitem__(self, index: int) -> RecordMetadata:
        if index < 0 or (self._max_index is not None and index >= self._max_index):
            raise _out_of_range(index, self._max_index)
        n = self._check_not_empty()
        epoch, i = divmod(index // self._shard_options.shard_count, n)
        if self._shuffle:
            i = index_shuffle(i, n - 1, (self._seed + epoch) % 2**32, _SHUFFLE_ROUNDS)
        rng = None if self._seed is None else LazyRng(self._seed + index)
        return RecordMetadata(index=index, record_key=self._start + i, rng=rng)

    def locate(self, indices: np.ndarray) -> SampledIndices:
        """Record keys and rng keys of many global indices at once: ``locate(i).keys[0] == self[i].record_key``."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size == 0:
            return SampledIndices(indices.copy(), _seeds(self._seed, indices))
        epochs, pos = np.divmod(indices // self._shard_options.shard_count, self._check_not_empty())
        return SampledIndices(self._keys(pos, epochs), _seeds(self._seed, indices))
