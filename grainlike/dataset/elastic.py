"""Restoring Dataset iterators on another number of shards or workers.

``ElasticIterator``: grain 0.2.18's iterator that restores on another number of shards.
Each shard reads elements ``global_next_index + shard_index :: shard_count`` of
an unbatched, unsharded ``MapDataset`` in batches of
``global_batch_size // shard_count``; after ``k`` steps every shard's state is
``{"global_next_index": k * global_batch_size}``, the same on every shard. A
state of any shard therefore restores every shard of any shard count (and any
global batch size): the next global batch starts at that element.

``rebalance_worker_states``: an ``mp_prefetch`` state restored on another number
of workers (grainlike only; grain refuses it).
"""

from __future__ import annotations

from typing import Any, Optional

from grainlike.core import sharding
from grainlike.dataset.base import DatasetIterator, IterDataset, MapDataset
from grainlike.dataset.filter import FilterMapDataset
from grainlike.dataset.options import MultiprocessingOptions, ReadOptions

_GLOBAL_NEXT_INDEX = "global_next_index"


class _ElasticMapDatasetIterator(DatasetIterator):
    """Iterates one shard's batches; its state is the global position of the next batch."""

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
        self._ds = ds
        self._global_batch_size = global_batch_size
        self._shard_options = shard_options
        self._global_next_index = 0
        self._read_options = read_options
        self._multiprocessing_options = multiprocessing_options
        self._iterator: Optional[DatasetIterator] = None

    def _build(self) -> DatasetIterator:
        """The shard's pipeline, from the next global index on (built on first use)."""
        shards = self._shard_options
        host_batch_size, remainder = divmod(self._global_batch_size, shards.shard_count)
        if remainder:
            raise ValueError(
                f"Global batch size {self._global_batch_size} is not divisible by"
                f" shard count {shards.shard_count}."
            )
        ds = self._ds[self._global_next_index + shards.shard_index :: shards.shard_count]
        ds = ds.batch(host_batch_size, drop_remainder=True)
        ds = ds.to_iter_dataset(read_options=self._read_options)
        if self._multiprocessing_options is not None:
            ds = ds.mp_prefetch(self._multiprocessing_options)
        return ds.__iter__()

    def __next__(self) -> Any:
        if self._iterator is None:
            self._iterator = self._build()
        result = next(self._iterator)
        self._global_next_index += self._global_batch_size
        return result

    def get_state(self) -> dict[str, Any]:
        return {_GLOBAL_NEXT_INDEX: self._global_next_index}

    def set_state(self, state: dict[str, Any]) -> None:
        """Moves to the global batch starting at ``state["global_next_index"]``.

        Raises:
          KeyError: the state has no ``global_next_index`` (as grain).
        """
        self._global_next_index = state[_GLOBAL_NEXT_INDEX]
        self._drop_iterator()

    def _drop_iterator(self) -> None:
        if self._iterator is not None:
            iterator, self._iterator = self._iterator, None
            iterator.close()

    def close(self) -> None:
        self._drop_iterator()

    def __str__(self) -> str:
        return (
            f"ElasticIterator(global_batch_size={self._global_batch_size}, "
            f"shard_options={self._shard_options!r}, "
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
        to_check = [ds]
        while to_check:
            next_ds = to_check.pop()
            if isinstance(next_ds, FilterMapDataset):
                raise ValueError("ElasticIterator does not support `filter` transformation.")
            to_check.extend(next_ds.parents)
        self._shard_options = shard_options
        self._global_batch_size = global_batch_size
        self._read_options = read_options
        self._multiprocessing_options = multiprocessing_options
        self._ds = ds
        self._default: Optional[_ElasticMapDatasetIterator] = None

    @property
    def _default_iterator(self) -> _ElasticMapDatasetIterator:
        if self._default is None:
            self._default = _ElasticMapDatasetIterator(
                self._ds,
                self._global_batch_size,
                self._shard_options,
                read_options=self._read_options,
                multiprocessing_options=self._multiprocessing_options,
            )
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
            f"ElasticIterator(global_batch_size={self._global_batch_size}, "
            f"shard_options={self._shard_options!r})"
        )


def rebalance_worker_states(
    states: list, num_workers: int, initial_state: Any, where: str
) -> tuple[list, int]:
    """``mp_prefetch`` worker states of another worker count, moved onto ``num_workers``.

    Worker ``i`` of ``k`` computes elements ``i, i + k, ...`` of the dataset below
    ``mp_prefetch``; where that dataset's state is a position (``{"next_index": n}``
    of a ``to_iter_dataset()`` slice, kept by maps, filters and batches above it),
    worker ``i`` has consumed elements ``i + j * k`` for ``j < n``. When these form
    a prefix ``[0, f)`` of the elements (a checkpoint after a whole round: every
    worker consumed as many), the new workers start at ``f``.

    Returns:
      The new workers' states and the worker whose output comes next.

    Raises:
      InvalidStateError: the states are not positions, or the workers'
        positions leave delivered elements above the first one not delivered
        (a Dataset pipeline cannot skip them; the DataLoader can).
    """
    from grainlike.core.errors import InvalidStateError

    def position(s: Any) -> Optional[int]:
        if isinstance(s, dict) and set(s) == {"next_index"}:
            n = s["next_index"]
            if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
                return n
        return None

    k = len(states)
    if position(initial_state) != 0:
        raise InvalidStateError(
            f"{where}: cannot restore a state of {k} workers on {num_workers}: the pipeline "
            f"below mp_prefetch keeps the state {initial_state!r}, not the position of a "
            "to_iter_dataset() slice ({'next_index': n}), so which elements each worker "
            "consumed cannot be known"
        )
    positions = [0 if s is None else position(s) for s in states]
    if any(p is None for p in positions):
        bad = next(s for s, p in zip(states, positions) if p is None)
        raise InvalidStateError(
            f"{where}: cannot restore a state of {k} workers on {num_workers}: a worker's "
            f"state {bad!r} is not a position ({{'next_index': n}})"
        )
    f = min(i + n * k for i, n in enumerate(positions))
    above = sorted(
        i + j * k for i, n in enumerate(positions) for j in range(max(0, -(-(f - i) // k)), n)
    )
    if above:
        raise InvalidStateError(
            f"{where}: cannot restore a state of {k} workers on {num_workers}: element {f} was "
            f"not consumed but {len(above)} after it were ({above[:8]}), and a Dataset "
            "pipeline cannot skip them. Checkpoint after a whole round of the workers (every "
            f"worker at the same count: workers' positions {positions}), or use a DataLoader, "
            "whose restore skips them"
        )
    new = [{"next_index": max(0, -(-(f - j) // num_workers))} for j in range(num_workers)]
    return new, f % num_workers
