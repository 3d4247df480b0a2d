"""Restoring Dataset iterators on another number of shards or workers.

``ElasticIterator``: grain 0.2.18's iterator that restores on another number of shards.
Each shard reads elements ``global_next_index + shard_index :: shard_count`` of
an unbatched, unsharded ``MapDataset`` in batches of
``global_batch_size // shard_count``; after ``k`` steps every shard's state is
``{"global_next_index": k * global_batch_size}``, the same on every shard. A
state of any shard therefore restores every shard of any shard count (and any
global batch size): the next global batch starts at that element.

``rebalance_worker_states``: an ``mp_prefetch`` state restored on another number
of workers (grainlike only; grain refuses it). The elements consumed before it
travel in each worker's state (``SKIP_KEY``); the reading stage (``SkippingReader``
of ``nodes.skipped_positions``: ``to_iter_dataset()``'s and the DataLoader's)
never delivers them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Optional, Sequence

from grainlike.core import sharding
from grainlike.dataset.nodes.dataset_node import walk
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.transformations.filter import FilterMapDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions, ReadOptions
# The skip list of a worker's state, which the reading stage keeps; grainlike.loader
# imports these names from here too.
from grainlike.dataset.nodes.skipped_positions import (  # noqa: F401
    SKIP_KEY,
    SkippingReader,
    skipped_in,
    split_skip_state,
    with_pending_skip,
)

_GLOBAL_NEXT_INDEX = "global_next_index"


@dataclasses.dataclass(frozen=True)
class _ElasticSpec:
    """What ``ElasticIterator`` was given; its iterators read from it."""

    ds: MapDataset
    global_batch_size: int
    shard_options: sharding.ShardOptions
    read_options: ReadOptions
    multiprocessing_options: Optional[MultiprocessingOptions]


class _ElasticMapDatasetIterator(DatasetIterator):
    """Iterates one shard's batches; its state is the global position of the next batch."""

    def __init__(self, spec: _ElasticSpec):
        super().__init__()
        self._spec = spec
        self._global_next_index = 0
        self._iterator: Optional[DatasetIterator] = None

    def _build(self) -> DatasetIterator:
        """The shard's pipeline, from the next global index on (built on first use)."""
        spec, shards = self._spec, self._spec.shard_options
        host_batch_size, remainder = divmod(spec.global_batch_size, shards.shard_count)
        if remainder:
            raise ValueError(
                f"Global batch size {spec.global_batch_size} is not divisible by"
                f" shard count {shards.shard_count}."
            )
        ds = spec.ds[self._global_next_index + shards.shard_index :: shards.shard_count]
        ds = ds.batch(host_batch_size, drop_remainder=True)
        ds = ds.to_iter_dataset(read_options=spec.read_options)
        if spec.multiprocessing_options is not None:
            ds = ds.mp_prefetch(spec.multiprocessing_options)
        return ds.__iter__()

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._build()
        result = next(self._iterator)
        self._global_next_index += self._spec.global_batch_size
        return result

    def get_state(self) -> dict[str, Any]:
        return {_GLOBAL_NEXT_INDEX: self._global_next_index}

    def set_state(self, state: dict[str, Any]) -> None:
        """Moves to the global batch starting at ``state["global_next_index"]``.

        Raises:
          StateKeyError: the state has no ``global_next_index`` (a ``KeyError``, as grain).
          StateTypeError / StateIndexError: it is not an int in ``[0, 2**63)``.
        """
        from grainlike.dataset.nodes.state import non_negative_int, require_keys

        require_keys(state, self, (_GLOBAL_NEXT_INDEX,))
        self._global_next_index = non_negative_int(state, _GLOBAL_NEXT_INDEX, self)
        self._drop_iterator()

    def _drop_iterator(self) -> None:
        if self._iterator is not None:
            iterator, self._iterator = self._iterator, None
            iterator.close()

    def close(self) -> None:
        self._drop_iterator()

    def __str__(self) -> str:
        return (
            f"ElasticIterator(global_batch_size={self._spec.global_batch_size}, "
            f"shard_options={self._spec.shard_options!r}, "
            f"global_next_index={self._global_next_index})"
        )


class ElasticIterator(IterDataset):
    """Batches and shards a ``MapDataset`` so that a checkpoint restores on any shard count.

    grain 0.2.18's ``grain.experimental.ElasticIterator``: the same constructor,
    elements and state. The dataset must be unbatched and unsharded: this
    iterator batches (``global_batch_size // shard_count`` per shard, remainder
    dropped) and shards. Every shard's state after the same number of steps is
    the same, so any shard's state restores all shards after a change of shard
    count or global batch size. ``filter`` is refused (a batch's elements must
    be a fixed slice of the dataset).

    Args:
      ds: an unbatched, unsharded ``MapDataset``.
      global_batch_size: the batch size over all shards; divisible by the shard count.
      shard_options: this process's shard (e.g. ``ShardByJaxProcess()``).
      read_options: read options of ``to_iter_dataset``.
      multiprocessing_options: if given, the shard's batches are computed by
        ``mp_prefetch`` workers.

    Raises:
      ValueError: ``ds`` contains a ``filter``.

    Example:
      >>> import grainlike as grain
      >>> ds = grain.MapDataset.range(10)
      >>> it = grain.experimental.ElasticIterator(ds, 4, grain.NoSharding())
      >>> next(it).tolist(), it.get_state()
      ([0, 1, 2, 3], {'global_next_index': 4})
    """

    def __init__(
        self,
        ds: MapDataset,
        global_batch_size: int,
        shard_options: sharding.ShardOptions,
        *,
        read_options: ReadOptions = ReadOptions(),
        multiprocessing_options: Optional[MultiprocessingOptions] = None,
    ):
        super().__init__()
        if any(isinstance(node, FilterMapDataset) for node in walk(ds)):
            raise ValueError("ElasticIterator does not support `filter` transformation.")
        self._spec = _ElasticSpec(ds, global_batch_size, shard_options, read_options, multiprocessing_options)
        self._default: Optional[_ElasticMapDatasetIterator] = None

    @property
    def _default_iterator(self) -> _ElasticMapDatasetIterator:
        if self._default is None:
            self._default = _ElasticMapDatasetIterator(self._spec)
        return self._default

    def __iter__(self) -> DatasetIterator:
        """The one iterator of this object (as grain: every call returns it)."""
        return self._default_iterator

    def __next__(self) -> Any:
        """Advances the default iterator, so that this object is used as an iterator."""
        return next(self._default_iterator)

    def close(self) -> None:
        """Closes the default iterator, if it was created."""
        if self._default is not None:
            self._default.close()

    def get_state(self) -> dict[str, Any]:
        """The state of the default iterator: ``{"global_next_index": n}``."""
        return self._default_iterator.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        """Sets the state of the default iterator (of any shard count)."""
        self._default_iterator.set_state(state)

    def __str__(self) -> str:
        return (
            f"ElasticIterator(global_batch_size={self._spec.global_batch_size}, "
            f"shard_options={self._spec.shard_options!r})"
        )


# The most delivered positions above the first one not delivered that a restore
# skips; workers further apart are no state mp_prefetch writes.
MAX_WINDOW = 1_000_000


def round_robin_frontier(next_positions: Sequence[int], extra: Iterable[int], where: str) -> tuple[int, list[int]]:
    """What ``k = len(next_positions)`` round-robin workers consumed, as positions.

    Worker ``i`` consumed positions ``i + j * k`` for ``j < next_positions[i]``;
    ``extra`` are positions consumed beside those (skipped after an earlier restore).

    Returns:
      ``(f, above)``: every position below ``f`` was consumed, ``f`` was not, and
      ``above`` (sorted) are the consumed positions above ``f``.

    Raises:
      InvalidStateError: more than ``MAX_WINDOW`` positions above ``f`` were
        consumed (no state a pipeline writes); the message starts with ``where``.
    """
    from grainlike.core.errors import InvalidStateError

    k = len(next_positions)
    f = min(i + n * k for i, n in enumerate(next_positions))
    firsts = [max(0, -(-(f - i) // k)) for i in range(k)]  # worker i's first position >= f
    window = sum(max(0, n - first) for n, first in zip(next_positions, firsts))
    if window > MAX_WINDOW:
        raise InvalidStateError(
            f"{where}: the workers are {window} positions apart (their next positions: "
            f"{list(next_positions)}); at most {MAX_WINDOW} consumed positions after the "
            "first one not consumed are skipped"
        )
    consumed = set(extra)
    for i, (n, first) in enumerate(zip(next_positions, firsts)):
        consumed.update(range(i + first * k, i + n * k, k))
    while f in consumed:
        f += 1
    return f, sorted(p for p in consumed if p > f)


def rebalance_worker_states(
    states: list, num_workers: int, initial_state: Any, where: str
) -> tuple[list, int]:
    """``mp_prefetch`` worker states of another worker count, moved onto ``num_workers``.

    Worker ``i`` of ``k`` computes elements ``i, i + k, ...`` of the dataset below
    ``mp_prefetch``; where that dataset's state is a position (``{"next_index": n}``
    of a ``to_iter_dataset()`` slice, kept by maps, filters and batches above it),
    worker ``i`` has consumed elements ``i + j * k`` for ``j < n`` (and those its
    ``"skip_positions"`` list names). The new workers start at the first element not
    consumed, ``f``, and skip the consumed ones above it (``SkippingReader``).

    Returns:
      The new workers' states and the worker whose output comes next.

    Raises:
      InvalidStateError: the states are not positions, or are too far apart.
    """
    from grainlike.core.errors import InvalidStateError

    def position(s: Any) -> Optional[tuple[int, list]]:
        if isinstance(s, dict) and set(s) in ({"next_index"}, {"next_index", SKIP_KEY}):
            n, skip = s["next_index"], s.get(SKIP_KEY, [])
            ints = isinstance(skip, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in skip)
            if isinstance(n, int) and not isinstance(n, bool) and n >= 0 and ints:
                return n, skip
        return None

    k = len(states)
    if position(initial_state) != (0, []):
        raise InvalidStateError(
            f"{where}: cannot restore a state of {k} workers on {num_workers}: the pipeline "
            f"below mp_prefetch keeps the state {initial_state!r}, not the position of a "
            "to_iter_dataset() slice ({'next_index': n}), so which elements each worker "
            "consumed cannot be known"
        )
    positions = [(0, []) if s is None else position(s) for s in states]
    if any(p is None for p in positions):
        bad = next(s for s, p in zip(states, positions) if p is None)
        raise InvalidStateError(
            f"{where}: cannot restore a state of {k} workers on {num_workers}: a worker's "
            f"state {bad!r} is not a position ({{'next_index': n}})"
        )
    extra = [i + p * k for i, (_, skip) in enumerate(positions) for p in skip]
    f, above = round_robin_frontier([n for n, _ in positions], extra, where)
    new = []
    for j in range(num_workers):
        state: dict = {"next_index": max(0, -(-(f - j) // num_workers))}
        skip = [(g - j) // num_workers for g in above if g % num_workers == j]
        if skip:
            state[SKIP_KEY] = skip
        new.append(state)
    return new, f % num_workers
