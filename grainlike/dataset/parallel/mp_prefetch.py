"""``IterDataset.mp_prefetch``: a dataset computed in worker processes, one slice each.

Worker ``w`` of ``W`` iterates over its own copy of the parent dataset, sliced
where grain slices it (``grainlike.dataset.nodes.worker_slice``), with its iterators
told they run as process ``w`` of ``W``. The outputs are taken round-robin; a
worker that ends is skipped, and the iteration ends when all have. The workers
are the DataLoader's (``grainlike.workers.pool.WorkerPool``).

The state is grain 0.2.18's (its ``mp_prefetch`` interleaves one prefetching
iterator per worker)::

    {"next_index_in_cycle": next worker,
     "next_index_in_datasets": W,
     "iterators_in_use_indices": [0, 1, ..., W - 1],
     "iterators_in_use_states": [state of worker 0's iterator, ...],
     "exhausted": [0 or 1 per worker],
     "future_states": {}}

where a worker's state is its sliced iterator's ``get_state()`` after its last
delivered output (before its first, the parent iterator's initial state).
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Optional

from grainlike.core.errors import InvalidStateError, WorkerDiedError, is_int
from grainlike.dataset.nodes import worker_slice
from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator, closing_dropped, get_next_index, set_next_index
from grainlike.dataset.nodes.state import interleave_state
from grainlike.dataset.parallel.worker_remainders import warn_if_workers_drop_more
from grainlike.dataset.parallel.worker_slice_task import WorkerSliceTask
from grainlike.workers.liveness import DEFAULT_STALL_TIMEOUT_S
from grainlike.workers.pool import WorkerPool

# Restarts of the workers (restart_dead_workers) within one next() before the
# death is raised: a worker that dies on the same element again would loop.
_MAX_RESTARTS = 3


class MultiprocessPrefetchIterDataset(IterDataset):
    """The parent dataset, computed in ``options.num_workers`` worker processes.

    Built by ``IterDataset.mp_prefetch``; see the module docstring.

    Args:
      parent: the dataset each worker computes a slice of.
      options: a ``MultiprocessingOptions`` (grainlike's or grain's) with
        ``num_workers > 0``; ``per_worker_buffer_size`` outputs per worker are
        computed ahead.
      worker_init_fn: called in each worker as ``fn(worker_index, worker_count)``
        before the worker loads the dataset.
      error_ends_worker: an error in worker ``w`` ends ``w`` only, as in grain
        (see the iterator). False stops every worker instead, and the next
        ``next()`` restarts them all from their last delivered outputs (the
        DataLoader's behaviour).
      sequential_slice: each worker reads a contiguous range of the sources
        (see ``grainlike.dataset.nodes.worker_slice``).

    Raises:
      ValueError: ``num_workers`` or ``per_worker_buffer_size`` is not positive.

    Example:
      >>> from grainlike.dataset.base import MapDataset
      >>> from grainlike.dataset.nodes.options import MultiprocessingOptions
      >>> ds = MapDataset.range(6).to_iter_dataset().map(lambda x: x * 10)
      >>> list(ds.mp_prefetch(MultiprocessingOptions(num_workers=2)))
      [0, 10, 20, 30, 40, 50]
    """

    _element_spec = parent_element_spec
    # What IterDataset.mp_prefetch calls after building this stage (nodes/ cannot import
    # it); a staticmethod, so that its warning still names the user's line.
    warn_if_workers_drop_more = staticmethod(warn_if_workers_drop_more)

    def __init__(
        self,
        parent: IterDataset,
        options: Any,
        worker_init_fn: Optional[Callable[[int, int], None]] = None,
        *,
        error_ends_worker: bool = True,
        sequential_slice: bool = False,
    ):
        super().__init__(parent)
        # grain's MultiprocessingOptions has the same fields, less some of grainlike's.
        num_workers = getattr(options, "num_workers", None)
        buffer_size = getattr(options, "per_worker_buffer_size", 1)
        if not is_int(num_workers) or num_workers <= 0:
            raise ValueError(f"mp_prefetch needs options.num_workers > 0, got {num_workers!r}")
        if not is_int(buffer_size) or buffer_size <= 0:
            raise ValueError(f"`buffer_size` must be greater than 0, got {buffer_size}.")
        self._options = options
        self._num_workers = num_workers
        self._buffer_size = buffer_size
        self._worker_init_fn = worker_init_fn
        self._error_ends_worker = error_ends_worker
        self._sequential_slice = sequential_slice

    def __str__(self) -> str:
        return (
            f"MultiprocessPrefetchIterDataset(num_workers={self._num_workers}, "
            f"per_worker_buffer_size={self._buffer_size})"
        )

    def __iter__(self) -> "MultiprocessPrefetchDatasetIterator":
        options = self._options
        return MultiprocessPrefetchDatasetIterator(
            self._parent,
            self._num_workers,
            self._buffer_size,
            enable_profiling=bool(getattr(options, "enable_profiling", False)),
            warm_start=bool(getattr(options, "warm_start", False)),
            worker_init_fn=self._worker_init_fn,
            error_ends_worker=self._error_ends_worker,
            stall_timeout_s=getattr(options, "stall_timeout_s", DEFAULT_STALL_TIMEOUT_S),
            restart_dead_workers=bool(getattr(options, "restart_dead_workers", False)),
            sequential_slice=self._sequential_slice,
        )


class MultiprocessPrefetchDatasetIterator(DatasetIterator):
    """Round-robin over the workers' outputs; grain's state (see the module docstring).

    Workers start at the first ``next()`` or ``start_prefetch()`` and stop at
    ``close()`` (or when the iterator is garbage collected, or at exit);
    ``set_state()`` sends running workers their new states, as grain's does.

    An error raised in worker ``w`` reaches the caller once, with its type and
    the worker's traceback; as in grain, ``w`` then counts as exhausted at the
    state of its last delivered output and the others go on. ``w``'s death (a
    signal, a crash, the out-of-memory killer, a stall) is raised by every
    later ``next()`` (``WorkerDiedError``, a ``RuntimeError`` as grain's), where
    grain ends the iteration without ``w``'s remaining elements. ``get_state()``
    stays the state after the last delivered element.

    Args:
      parent, worker_init_fn, error_ends_worker, sequential_slice: as
        ``MultiprocessPrefetchIterDataset``'s (with ``sequential_slice``, a
        state restores only on the same number of workers).
      num_workers: worker processes (> 0).
      buffer_size: outputs each worker computes ahead.
      enable_profiling, warm_start, stall_timeout_s, restart_dead_workers:
        ``MultiprocessingOptions``' (``warm_start`` not with a ``worker_init_fn``,
        which only workers run).
    """

    # A prefetch node of grain's execution statistics, counting the bytes it hands over.
    _STATS_PREFETCH = True
    _STATS_RECORDS_BYTES = True

    def __init__(
        self,
        parent: IterDataset,
        num_workers: int,
        buffer_size: int,
        *,
        enable_profiling: bool = False,
        warm_start: bool = False,
        worker_init_fn: Optional[Callable[[int, int], None]] = None,
        error_ends_worker: bool = True,
        stall_timeout_s: Optional[float] = DEFAULT_STALL_TIMEOUT_S,
        restart_dead_workers: bool = False,
        sequential_slice: bool = False,
    ):
        super().__init__()
        from grainlike.dataset.parallel.multithread import _dataset_options

        # The options set upstream hold for the stages after this one too (the
        # parent's iterator, where they are set, lives in the workers), as in grain.
        self._ctx.dataset_options = _dataset_options(parent)
        self._parent_ds = parent
        self._restart_dead_workers = restart_dead_workers
        self._stall_timeout_s = stall_timeout_s
        self._sequential_slice = sequential_slice
        self._task = WorkerSliceTask(parent, worker_init_fn, sequential_slice)
        self._w = num_workers
        self._buffer_size = buffer_size
        self._profile = enable_profiling
        self._warm_start = warm_start and worker_init_fn is None
        self._error_ends_worker = error_ends_worker
        # Each worker's state after its last delivered output; None: not started.
        self._states: list = [None] * num_workers
        self._exhausted = [False] * num_workers
        self._next_worker = 0
        self._pool: Optional[WorkerPool] = None
        self._start_state: Any = None
        # Where the workers write their execution statistics, once collected (``worker_stats``).
        self._reports: Optional[Any] = None
        # next(), set_state() and start_prefetch() from several threads take
        # turns; get_state() and close() never wait behind a blocked next().
        self._consumer_lock = threading.RLock()

    # -- running ---------------------------------------------------------------

    def _ensure_pool(self) -> WorkerPool:
        if self._pool is None:
            self._task.dataset_options = self._ctx.dataset_options
            # (``_stats`` is in the instance once it was read or execution statistics were attached.)
            if self._reports is None and "_stats" in self.__dict__:
                from grainlike.dataset.execution_stats import ExecutionStats

                if isinstance(self._stats, ExecutionStats):
                    from grainlike.dataset.parallel.worker_stats import ReportDir

                    self._reports = ReportDir()
                    self._task.stats_dir = self._reports.path
            self._pool = self._new_pool(
                self._task,
                self._w,
                self._states,
                self._next_worker,
                exhausted=self._exhausted,
                error_ends_worker=self._error_ends_worker,
                stall_timeout_s=self._stall_timeout_s,
            )
        return self._pool

    def _new_pool(self, *args: Any, **kwargs: Any) -> WorkerPool:
        """The pool of this iterator's workers: processes here; another transport in a subclass."""
        return WorkerPool(
            *args, buffer_size=self._buffer_size, profile=self._profile, warm_start=self._warm_start, **kwargs
        )

    def _drop_pool(self, dropped: bool = False) -> None:
        """Stops the workers (``dropped``: see ``WorkerPool.close``), keeping their states as the iterator's."""
        pool = self._pool
        if pool is not None:
            # The states first, then the pool goes: get_state() in another thread
            # sees one or the other.
            self._states, self._next_worker, self._exhausted = pool.delivered()
            self._pool = None
            pool.close(dropped=dropped)

    def __next__(self) -> Any:
        with self._consumer_lock:
            restarts = 0
            while True:
                pool = self._pool
                if pool is None or self._closed:  # (Both checks at once: this runs per element.)
                    self._assert_not_closed()
                    pool = self._ensure_pool()
                try:
                    return pool.__next__()
                except StopIteration:
                    raise
                except BaseException as e:
                    restart = self._restart_dead_workers and restarts < _MAX_RESTARTS
                    if isinstance(e, WorkerDiedError) and restart and not self._closed:
                        # Every worker starts again from the last delivered element.
                        restarts += 1
                        self._drop_pool()
                        continue
                    if pool.broken and not self._closed:
                        # The next call restarts the workers from the last delivered outputs.
                        self._drop_pool()
                    raise

    def worker_summaries(self) -> list:
        """The workers' latest execution summaries (with statistics on; see ``worker_stats``)."""
        return [] if self._reports is None else self._reports.summaries()

    def start_prefetch(self) -> None:
        """Starts the workers now, so the first outputs are ready sooner."""
        with self._consumer_lock:
            self._assert_not_closed()
            self._ensure_pool().start()

    def _close(self) -> None:
        """Stops the workers (not waiting on one mid-output if nobody holds the iterator)."""
        self._drop_pool(dropped=closing_dropped())

    # -- state -------------------------------------------------------------------

    def _initial_state(self) -> Any:
        """A worker's state before its first output: the parent iterator's initial state."""
        if self._start_state is None:
            it = self._parent_ds.__iter__()
            try:
                self._start_state = it.get_state()
            finally:
                it.close()
        return copy.deepcopy(self._start_state)

    def get_state(self) -> dict:
        pool = self._pool
        if pool is not None:
            # Consistent without waiting for a next() running in another thread.
            states, next_worker, exhausted = pool.delivered()
        else:
            states, next_worker, exhausted = self._states, self._next_worker, self._exhausted
        return {
            "next_index_in_cycle": next_worker,
            "next_index_in_datasets": self._w,
            "iterators_in_use_indices": list(range(self._w)),
            "iterators_in_use_states": [
                self._initial_state() if s is None else copy.deepcopy(s) for s in states
            ],
            "exhausted": [int(e) for e in exhausted],
            "future_states": {},
        }

    def set_state(self, state: dict) -> None:
        """Moves every worker to its state in ``state``, in the same worker processes.

        As grain does, running workers are sent their new states and go on from
        there (what they computed ahead is dropped); where they cannot be (none
        started yet, or one failed or died), workers start from ``state`` at the
        next ``next()``.

        Raises:
          InvalidStateError (a ValueError): ``state`` is not an mp_prefetch state of
            this many workers, or a worker state does not fit the parent
            dataset (then also ``KeyError`` / ``IndexError`` as the parent raises).
        """
        with self._consumer_lock:
            self._set_state(state)

    def _set_state(self, state: dict) -> None:
        w = self._w
        where = f"{self}.set_state"
        interleave_state(state, where)
        indices, states, exhausted = (
            state["iterators_in_use_indices"],
            state["iterators_in_use_states"],
            state["exhausted"],
        )
        old_w = state["next_index_in_datasets"]
        if (
            is_int(old_w)
            and 0 < old_w != w
            and isinstance(indices, list)
            and indices == list(range(old_w))
            and isinstance(states, list)
            and len(states) == old_w
        ):
            # Another worker count: the same elements from the first one not
            # delivered on (see grainlike/dataset/parallel/elastic.py).
            if self._sequential_slice:
                raise InvalidStateError(
                    f"{where}: cannot restore a state of {old_w} workers on {w} with "
                    "sequential_slice=True: each worker reads a contiguous range of the "
                    "sources whose bounds depend on the number of workers. Restore it on "
                    f"{old_w} workers (or use sequential_slice=False, whose states move "
                    "between worker counts)"
                )
            from grainlike.dataset.parallel.elastic import rebalance_worker_states

            states, cycle = rebalance_worker_states(states, w, self._initial_state(), where)
            state = {**state, "next_index_in_cycle": cycle, "exhausted": [0] * w}
            indices, exhausted = list(range(w)), [0] * w
            state["next_index_in_datasets"] = w
        if (
            list(indices) != list(range(w))
            or state["next_index_in_datasets"] != w
            or len(states) != w
            or len(exhausted) != w
        ):
            raise InvalidStateError(
                f"{where}: the state is of another number of workers or another "
                f"pipeline: iterators_in_use_indices={indices!r}, next_index_in_datasets="
                f"{state['next_index_in_datasets']!r}, {len(states)} worker states; this "
                f"iterator has {w} workers"
            )
        cycle = state["next_index_in_cycle"]
        if not is_int(cycle) or not 0 <= cycle < w:
            raise InvalidStateError(f"{where}: next_index_in_cycle must be an int in [0, {w}), got {cycle!r}")
        if any(e not in (0, 1) for e in exhausted):
            raise InvalidStateError(f"{where}: exhausted must hold 0 or 1 per worker, got {exhausted!r}")
        if state.get("future_states"):
            raise InvalidStateError(
                f"{where}: future_states must be empty for mp_prefetch, got {state['future_states']!r}"
            )
        # A worker that has delivered nothing reports the parent iterator's initial
        # state (as grain does), which may not fit its slice: it starts afresh.
        initial = self._initial_state()
        new_states = [None if s == initial else s for s in copy.deepcopy(list(states))]
        # Each worker state is checked now, on its slice, so that a bad one leaves this iterator as it was.
        for worker_index, worker_state in enumerate(new_states):
            if worker_state is None:
                continue
            ds = self._parent_ds
            if w > 1:
                ds = worker_slice.copy_stages(ds, self._sequential_slice)
                worker_slice.set_slice(ds, slice(worker_index, None, w), self._sequential_slice)
            probe = ds.__iter__()
            try:
                probe.set_state(copy.deepcopy(worker_state))
            finally:
                probe.close()
        new_exhausted = [bool(e) for e in exhausted]
        pool = self._pool
        if pool is None or not pool.reset(new_states, cycle, new_exhausted):
            self._drop_pool()  # New workers start from the state at the next next().
        self._states = new_states
        self._exhausted = new_exhausted
        self._next_worker = cycle

    # -- next index (grain's experimental get_next_index / set_next_index) ----------

    def _only_worker_iterator(self, what: str) -> DatasetIterator:
        """A parent iterator, in this process, at the only worker's delivered state."""
        if self._w != 1:
            raise NotImplementedError(
                f"{what} is not supported for InterleaveDatasetIterator with more than one "
                f"dataset: {self} has {self._w} workers, each at its own index (as in grain, "
                "only mp_prefetch with num_workers=1 has one)"
            )
        states = MultiprocessPrefetchDatasetIterator.get_state(self)["iterators_in_use_states"]
        it = self._parent_ds.__iter__()
        it.set_state(states[0])
        return it

    def _get_next_index(self) -> int:
        it = self._only_worker_iterator("get_next_index")
        try:
            return get_next_index(it)
        finally:
            it.close()

    def _set_next_index(self, index: int) -> None:
        # Moved here (a stage that cannot raises now); the worker goes on from the state at that index.
        it = self._only_worker_iterator("set_next_index")
        try:
            set_next_index(it, index)
            worker_state = it.get_state()
        finally:
            it.close()
        state = MultiprocessPrefetchDatasetIterator.get_state(self)
        state.update(next_index_in_cycle=0, iterators_in_use_states=[worker_state], exhausted=[0])
        MultiprocessPrefetchDatasetIterator.set_state(self, state)

    def __str__(self) -> str:
        return (
            f"MultiprocessPrefetchDatasetIterator(num_workers={self._w}, "
            f"per_worker_buffer_size={self._buffer_size})"
        )
