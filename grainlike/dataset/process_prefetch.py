"""``IterDataset.mp_prefetch``: a dataset computed in worker processes, one slice each.

Worker ``w`` of ``W`` iterates over its own copy of the parent dataset, sliced
where grain slices it (the ``MapDataset`` under ``to_iter_dataset()`` keeps the
indices ``w, w + W, ...``; with ``sequential_slice`` each source keeps worker
``w``'s contiguous range instead, see ``grainlike.dataset.worker_slice``), with
its iterators told they run as process ``w`` of ``W``. The outputs are taken
round-robin; a worker that ends is skipped, and the iteration ends when all
have. Everything runs on the shared worker pool
(``grainlike.workers.pool.WorkerPool``): the same process start, shared-memory batches,
liveness checks and error reports as the DataLoader's workers.

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
import functools
import sys
import threading
import warnings
from typing import Any, Callable, Iterator, Optional

import cloudpickle

from grainlike.core import pickling
from grainlike.core.errors import InvalidStateError, WorkersDropRemaindersWarning, add_note
from grainlike.core.transforms import transform_name
from grainlike.core.tree import Allocator
from grainlike.dataset import worker_slice
from grainlike.dataset.base import (
    DatasetIterator,
    IterDataset,
    MapDataset,
    MultiprocessingContext,
    _Dataset,
    closing_dropped,
    get_next_index,
    set_next_index,
)
from grainlike.dataset.state import interleave_state
from grainlike.core.errors import WorkerDiedError
from grainlike.workers.liveness import DEFAULT_STALL_TIMEOUT_S
from grainlike.workers.pool import WorkerPool

# Restarts of the workers (restart_dead_workers) within one next() before the
# death is raised: a worker that dies on the same element again would loop.
_MAX_RESTARTS = 3

_STATE_KEYS = (
    "next_index_in_cycle",
    "next_index_in_datasets",
    "iterators_in_use_indices",
    "iterators_in_use_states",
    "exhausted",
)


def _output_count(ds: Any, sl: Optional[slice]) -> Optional[tuple[int, Callable[[int], int]]]:
    """What ``ds`` yields with its source sliced by ``sl`` (None: unsliced).

    Returns ``(outputs, covered)``: how many elements it yields, and ``covered(k)``,
    how many of its source's elements the first ``k`` of them hold. None where
    that is not known without iterating: any stage but maps, thread prefetch and
    batches over ``to_iter_dataset()`` of a MapDataset of finite length that no
    filter or flat_map can leave with Nones.
    """
    from grainlike.dataset.batch import BatchIterDataset, discarding_stage
    from grainlike.dataset.map import MapIterDataset, MapWithIndexIterDataset, RandomMapIterDataset
    from grainlike.dataset.prefetch import PrefetchIterDataset
    from grainlike.dataset.thread_prefetch import ThreadPrefetchIterDataset

    if isinstance(ds, (MapIterDataset, RandomMapIterDataset, MapWithIndexIterDataset, ThreadPrefetchIterDataset)):
        return _output_count(ds._parent, sl)
    if isinstance(ds, BatchIterDataset):
        below = _output_count(ds._parent, sl)
        if below is None:
            return None
        n, covered, size = below[0], below[1], ds._batch_size
        outputs = n // size if ds._drop_remainder else -(-n // size)
        return outputs, lambda k: covered(min(k * size, n))
    if type(ds) is PrefetchIterDataset:  # to_iter_dataset(), where workers slice
        if not ds._allow_nones and discarding_stage(ds._parent) is not None:
            return None
        n = len(ds._parent)
        if n >= sys.maxsize:  # repeated forever: nothing is left over at an end
            return None
        return (n if sl is None else len(range(n)[sl])), lambda k: k
    return None


def _dropping_batch(ds: Any) -> Any:
    """The ``drop_remainder=True`` batch nearest to ``ds`` among the stages ``_output_count`` knows."""
    from grainlike.dataset.batch import BatchIterDataset

    while not (isinstance(ds, BatchIterDataset) and ds._drop_remainder):
        ds = ds._parent
    return ds


def _worker_output_count(
    parent: IterDataset, worker_index: int, num_workers: int, sequential_slice: bool
) -> Optional[tuple[int, Callable[[int], int]]]:
    """``_output_count`` of worker ``worker_index``'s slice of ``parent`` (None: not known)."""
    sl = slice(worker_index, None, num_workers)
    if not sequential_slice:
        return _output_count(parent, sl)
    # The sources are sliced: count on a sliced copy.
    ds = worker_slice.copy_stages(parent, sequential_slice=True)
    try:
        worker_slice.set_slice(ds, sl, sequential_slice=True)
    except (ValueError, NotImplementedError):
        return None  # The workers raise it.
    return _output_count(ds, None)


def warn_if_workers_drop_more(parent: IterDataset, num_workers: int, sequential_slice: bool = False) -> None:
    """Warns when ``parent.mp_prefetch`` delivers fewer elements than ``parent`` would.

    Each worker batches its own slice, so a ``batch(..., drop_remainder=True)``
    below ``mp_prefetch`` drops one partial batch per worker (grain 0.2.18 does
    the same; the output is kept). Decided from the lengths where
    ``_output_count`` knows them; otherwise nothing is said.
    """
    if num_workers < 2:
        return
    whole = _output_count(parent, None)
    if whole is None:
        return
    outputs, kept = whole[0], whole[1](whole[0])
    sliced = [_worker_output_count(parent, w, num_workers, sequential_slice) for w in range(num_workers)]
    if any(count is None for count in sliced):
        return
    worker_outputs = sum(count for count, _ in sliced)
    worker_kept = sum(covered(count) for count, covered in sliced)
    if worker_kept >= kept:
        return
    batch = _dropping_batch(parent)
    source = parent
    while isinstance(source, IterDataset):  # down to the MapDataset under to_iter_dataset()
        source = source._parent
    warnings.warn(
        f"mp_prefetch(num_workers={num_workers}) delivers {worker_kept} of the "
        f"{len(source)} elements of its to_iter_dataset() in {worker_outputs} "
        f"outputs; the same pipeline without workers delivers {kept} in {outputs}: each "
        f"worker batches its own slice, and its {batch} drops each worker's partial last batch (as in grain, whose output "
        "and states grainlike keeps). To drop only the last partial batch, batch after "
        f"mp_prefetch (e.g. ....mp_prefetch(options).batch({batch._batch_size}, drop_remainder=True)).",
        WorkersDropRemaindersWarning,
        stacklevel=3,
    )


def _user_transforms(ds: Any) -> list:
    """The user transforms of ``ds``'s pipeline, nearest to its output first, each once."""
    found, seen, to_visit = [], set(), [ds]
    while to_visit:
        node = to_visit.pop()
        if isinstance(node, _Dataset):
            for transform in reversed(node.user_transforms()):
                if id(transform) not in seen:
                    seen.add(id(transform))
                    found.append(transform)
        # Parents in order: the first (an elastic stage's pipeline in use) first.
        to_visit.extend(reversed(getattr(node, "_parents", ())))
    return found


def _pickling_error(ds: Any, error: Exception) -> Exception:
    """The error of the first stage (parents first) that cannot be pickled, as grain.

    Where one of the stage's user transforms cannot be pickled by itself, a note
    names it (class or function and where it was defined).
    """
    for parent in getattr(ds, "_parents", ()):
        found = _pickling_error(parent, error)
        if found is not error:
            return found
    try:
        cloudpickle.dumps(ds)
    except Exception as e:
        add_note(e, f"Dataset: {ds} cannot be pickled!")
        transforms = ds.user_transforms() if isinstance(ds, _Dataset) else ()
        for transform in transforms:
            try:
                cloudpickle.dumps(transform)
            except Exception as why:  # noqa: BLE001 - any failure is this transform's
                add_note(
                    e,
                    f"grainlike: the transform {transform_name(transform)} cannot be pickled "
                    f"({type(why).__name__}: {why}); worker processes receive the pipeline "
                    "pickled (cloudpickle). Keep locks, open files, generators and similar "
                    "objects out of its attributes (create them lazily, in the worker), or "
                    "give its class __getstate__/__reduce__.",
                )
                break
        return e
    return error


_SCALARS = (int, str, float, bool, type(None))


def _snapshot(state: Any) -> Any:
    """A copy of ``state`` that later steps of the iterator cannot change.

    A flat dict of scalars (``{"next_index": p}``, the common case) is copied
    as a dict; anything else is deep-copied.
    """
    if type(state) is dict:
        for v in state.values():
            if type(v) not in _SCALARS:
                return copy.deepcopy(state)
        return dict(state)
    return copy.deepcopy(state)


class _WorkerSliceTask:
    """A ``WorkerTask``: worker ``w`` iterates over its slice of the parent dataset.

    States are the sliced iterator's states; None starts a fresh iterator. The
    dataset travels as bytes of its own and is loaded after ``worker_init_fn``
    has run in the worker, as in grain (without one, as the task is loaded).
    A worker that is reset (``WorkerPool.reset``) calls ``outputs`` again: the
    ``worker_init_fn`` runs once per process, as in grain, and each call
    iterates over a fresh copy of the stages.
    """

    def __init__(
        self,
        parent: IterDataset,
        worker_init_fn: Optional[Callable[[int, int], None]],
        sequential_slice: bool = False,
    ):
        self._parent = parent
        self._worker_init_fn = worker_init_fn
        self._sequential_slice = sequential_slice
        self._dataset_bytes: Optional[bytes] = None
        self._initialized = False  # worker_init_fn has run in this process
        # The DatasetOptions of the whole pipeline, including those set after
        # mp_prefetch: the workers' stages follow them too, as in grain.
        self.dataset_options: Any = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self._dataset_bytes is None:
            state["_dataset_bytes"] = pickling.dumps(self._parent)
        state["_parent"] = None
        state.pop("_worker_dataset", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._worker_init_fn is None:
            # Loaded with the task, so that a worker reports itself loaded (warm
            # start hands over to it then) only once its sources and transforms are.
            self._parent = cloudpickle.loads(self._dataset_bytes)

    def _dataset(self) -> IterDataset:
        """A copy of the parent dataset, this worker's to slice."""
        if self._parent is None:
            # Loaded after the worker_init_fn, once (a reset slices another copy).
            self._parent = cloudpickle.loads(self._dataset_bytes)
        # A copy of the stages only (what slicing changes): in the calling
        # process, a pickled copy would unpickle the sources and transforms too.
        return worker_slice.copy_stages(self._parent, self._sequential_slice)

    def outputs(
        self, worker_index: int, worker_count: int, state: Any, alloc: Optional[Allocator]
    ) -> Iterator[tuple[Any, Any]]:
        if self._worker_init_fn is not None and not self._initialized:
            self._initialized = True
            self._worker_init_fn(worker_index, worker_count)
        ds = self._dataset()
        self._worker_dataset = ds  # For describe_output.
        if worker_count > 1:
            worker_slice.set_slice(ds, slice(worker_index, None, worker_count), self._sequential_slice)
        if isinstance(state, dict) and state.get("skip_positions"):
            # Restored on another worker count: elements consumed before it are
            # skipped (see grainlike/dataset/elastic.py), by the pipeline's own
            # skipping stage if it has one (the DataLoader's).
            from grainlike.dataset.elastic import contains_skip_stage, insert_skip_stage

            if not contains_skip_stage(ds):
                ds = insert_skip_stage(ds)
        set_allocator = getattr(ds, "set_allocator", None)
        if alloc is not None and callable(set_allocator):
            # The parent's batches are the outputs: stack them in shared memory.
            set_allocator(alloc)
        it = ds.__iter__()
        ctx = getattr(it, "_ctx", None)
        if ctx is not None:
            # Random stages on iterators draw per process (grain's mp_context).
            ctx.mp_context = MultiprocessingContext(process_index=worker_index, process_count=worker_count)
            if self.dataset_options is not None:
                ctx.dataset_options = self.dataset_options.merge(ctx.dataset_options)
        try:
            if state is not None:
                it.set_state(state)
            while True:
                try:
                    element = next(it)
                except StopIteration:
                    return
                yield _snapshot(it.get_state()), element
        finally:
            it.close()

    def end_state(self, worker_index: int, worker_count: int, state: Any) -> Any:
        # As grain: an exhausted worker keeps the state of its last output.
        return state

    def describe_output(self, worker_index: int, worker_count: int, before: Any, after: Any) -> str:
        """The stages that made an output (nearest first) and the worker's states around it."""
        stages, ds = [], getattr(self, "_worker_dataset", None) or self._parent
        while ds is not None and len(stages) < 4:
            describe = getattr(ds, "describe", None)  # grainlike's stages: with the transform's file:line
            stages.append(describe() if describe is not None else str(ds))
            parents = getattr(ds, "_parents", ())
            ds = parents[0] if len(parents) == 1 else None
        transforms = _user_transforms(getattr(self, "_worker_dataset", None) or self._parent)
        made = ""
        if transforms:
            names = ", ".join(transform_name(t) for t in transforms)
            made = f" went through the user transforms {names} (nearest first) and"
        return (
            f"The output of worker {worker_index}{made} came from {' <- '.join(stages)}, after "
            f"its iterator state {before!r} (its state after it: {after!r})."
        )

    def pickling_error(self, error: Exception) -> BaseException:
        try:
            cloudpickle.dumps(self._worker_init_fn)
        except Exception as e:
            return e
        return _pickling_error(self._parent, error)


def _options_value(options: Any, name: str, default: Any) -> Any:
    # grain's MultiprocessingOptions has the same fields, less warm_start.
    return getattr(options, name, default)


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
        (see ``grainlike.dataset.worker_slice``).

    Raises:
      ValueError: ``num_workers`` or ``per_worker_buffer_size`` is not positive.

    Example:
      >>> from grainlike.dataset.options import MultiprocessingOptions
      >>> ds = MapDataset.range(6).to_iter_dataset().map(lambda x: x * 10)
      >>> list(ds.mp_prefetch(MultiprocessingOptions(num_workers=2)))
      [0, 10, 20, 30, 40, 50]
    """

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
        num_workers = _options_value(options, "num_workers", None)
        buffer_size = _options_value(options, "per_worker_buffer_size", 1)
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers <= 0:
            raise ValueError(f"mp_prefetch needs options.num_workers > 0, got {num_workers!r}")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0:
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
        return MultiprocessPrefetchDatasetIterator(
            self._parent,
            self._num_workers,
            self._buffer_size,
            enable_profiling=bool(_options_value(self._options, "enable_profiling", False)),
            warm_start=bool(_options_value(self._options, "warm_start", False)),
            worker_init_fn=self._worker_init_fn,
            error_ends_worker=self._error_ends_worker,
            stall_timeout_s=_options_value(self._options, "stall_timeout_s", DEFAULT_STALL_TIMEOUT_S),
            restart_dead_workers=bool(_options_value(self._options, "restart_dead_workers", False)),
            sequential_slice=self._sequential_slice,
        )


class MultiprocessPrefetchDatasetIterator(DatasetIterator):
    """Round-robin over the workers' outputs; grain's state (see the module docstring).

    Workers start at the first ``next()`` or ``start_prefetch()`` and stop at
    ``close()`` (or when the iterator is garbage collected, or at exit);
    ``set_state()`` sends running workers their new states (grain's
    ``set_state`` does not restart its processes either), and so does
    ``repeat()`` at each new epoch.

    An error raised in worker ``w`` reaches the caller once, with its type and
    the worker's traceback; as in grain, ``w`` then counts as exhausted at the
    state of its last delivered output and the others go on. ``w``'s death (a
    signal, a crash, the out-of-memory killer, a stall) is raised by every
    later ``next()`` (``WorkerDiedError``, a ``RuntimeError`` as grain's), not
    only once: grain then ends the iteration without ``w``'s remaining
    elements. ``get_state()`` stays the state after the last delivered
    element, from which a new iterator goes on with nothing skipped or repeated.

    Args:
      parent: the dataset the workers slice.
      num_workers: worker processes (> 0).
      buffer_size: outputs each worker computes ahead.
      enable_profiling: workers log their timings when they stop.
      warm_start: compute the first outputs in the calling process while the
        workers start (not with a ``worker_init_fn``, which only workers run).
      worker_init_fn: called in each worker as ``fn(worker_index, worker_count)``.
      error_ends_worker: False: an error (or a worker's death) stops every worker
        instead, and the next ``next()`` restarts them all from their last
        delivered outputs.
      stall_timeout_s: see ``MultiprocessingOptions.stall_timeout_s``.
      restart_dead_workers: see ``MultiprocessingOptions.restart_dead_workers``.
      sequential_slice: each worker reads a contiguous range of the sources
        (see ``grainlike.dataset.worker_slice``); a state then restores only on
        the same number of workers.
    """

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
        from grainlike.dataset.multithread import _dataset_options

        # The options set upstream hold for the stages after this one too (the
        # parent's iterator, where they are set, lives in the workers), as in grain.
        self._ctx.dataset_options = _dataset_options(parent)
        self._parent_ds = parent
        self._restart_dead_workers = restart_dead_workers
        self._stall_timeout_s = stall_timeout_s
        self._sequential_slice = sequential_slice
        self._task = _WorkerSliceTask(parent, worker_init_fn, sequential_slice)
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
        # next(), set_state() and start_prefetch() from several threads take
        # turns; get_state() and close() never wait behind a blocked next().
        self._consumer_lock = threading.RLock()

    # -- running ---------------------------------------------------------------

    def _ensure_pool(self) -> WorkerPool:
        if self._pool is None:
            self._task.dataset_options = self._ctx.dataset_options
            self._pool = WorkerPool(
                self._task,
                self._w,
                self._states,
                self._next_worker,
                exhausted=self._exhausted,
                buffer_size=self._buffer_size,
                profile=self._profile,
                warm_start=self._warm_start,
                error_ends_worker=self._error_ends_worker,
                stall_timeout_s=self._stall_timeout_s,
            )
        return self._pool

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
                self._assert_not_closed()
                pool = self._ensure_pool()
                try:
                    return next(pool)
                except StopIteration:
                    raise
                except WorkerDiedError:
                    if self._restart_dead_workers and not self._closed and restarts < _MAX_RESTARTS:
                        # Every worker starts again from the last delivered element.
                        restarts += 1
                        self._drop_pool()
                        continue
                    if pool.broken and not self._closed:
                        self._drop_pool()
                    raise
                except BaseException:
                    if pool.broken and not self._closed:
                        # Interrupted mid-message: the next call restarts the workers from
                        # the last delivered outputs.
                        self._drop_pool()
                    raise

    def start_prefetch(self) -> None:
        """Starts the workers now, so the first outputs are ready sooner."""
        with self._consumer_lock:
            self._assert_not_closed()
            self._ensure_pool().start()

    def close(self) -> None:
        """Stops the workers. Idempotent; outputs already returned stay valid.

        Closing an iterator nobody holds (from its ``__del__``) does not wait for
        a worker in the middle of an output (see ``WorkerPool.close``).
        """
        if getattr(self, "_closed", True):
            return
        self._closed = True
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
        interleave_state(state, where, _STATE_KEYS)
        indices, states, exhausted = (
            state["iterators_in_use_indices"],
            state["iterators_in_use_states"],
            state["exhausted"],
        )
        old_w = state["next_index_in_datasets"]
        if (
            isinstance(old_w, int)
            and not isinstance(old_w, bool)
            and 0 < old_w != w
            and isinstance(indices, list)
            and indices == list(range(old_w))
            and isinstance(states, list)
            and len(states) == old_w
        ):
            # Another worker count: the same elements from the first one not
            # delivered on (see grainlike/dataset/elastic.py).
            if self._sequential_slice:
                raise InvalidStateError(
                    f"{where}: cannot restore a state of {old_w} workers on {w} with "
                    "sequential_slice=True: each worker reads a contiguous range of the "
                    "sources whose bounds depend on the number of workers. Restore it on "
                    f"{old_w} workers (or use sequential_slice=False, whose states move "
                    "between worker counts)"
                )
            from grainlike.dataset.elastic import rebalance_worker_states

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
        if isinstance(cycle, bool) or not isinstance(cycle, int) or not 0 <= cycle < w:
            raise InvalidStateError(f"{where}: next_index_in_cycle must be an int in [0, {w}), got {cycle!r}")
        if any(e not in (0, 1) for e in exhausted):
            raise InvalidStateError(f"{where}: exhausted must hold 0 or 1 per worker, got {exhausted!r}")
        if state.get("future_states"):
            raise InvalidStateError(
                f"{where}: future_states must be empty for mp_prefetch, got {state['future_states']!r}"
            )
        new_states = copy.deepcopy(list(states))
        # A worker that has delivered nothing reports the parent iterator's initial
        # state (as grain does), which may not fit its slice (an interleave of
        # fewer datasets than its cycle length): such a worker starts afresh.
        initial = self._initial_state()
        new_states = [None if s == initial else s for s in new_states]
        # Check each worker state on a parent iterator here, so that a bad state
        # fails now and leaves this iterator as it was.
        # A worker's state is one of its slice: a stage that slices what it
        # iterates (an interleave slices its datasets) is probed on that slice.
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
            # No workers running, or some that cannot take a new state (failed,
            # dead, still starting): new ones start from it at the next next().
            self._drop_pool()
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
        # The parent iterator moves here (a stage that cannot raises now); the
        # worker then goes on from its state at that index.
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


def _without_worker_index(fn: Callable[[], None], worker_index: int, worker_count: int) -> None:
    del worker_index, worker_count  # ProcessPrefetchIterDataset's worker_init_fn takes none.
    fn()


class ProcessPrefetchIterDataset(IterDataset):
    """The parent dataset, computed ahead in one background process (grain's name).

    The parent iterator runs whole (unsliced) in one worker of the shared worker
    pool, ``buffer_size`` outputs ahead. The iterator's state is the parent
    iterator's state, as in grain.

    Args:
      parent: the dataset to compute in the background process.
      buffer_size: outputs computed ahead (> 0).
      worker_init_fn: called with no arguments in the process before it loads
        the dataset.

    Raises:
      ValueError: ``buffer_size`` is not positive.

    Example:
      >>> ds = MapDataset.range(4).to_iter_dataset().map(lambda x: x + 1)
      >>> list(ProcessPrefetchIterDataset(ds, buffer_size=2))
      [1, 2, 3, 4]
    """

    def __init__(
        self,
        parent: IterDataset,
        buffer_size: int,
        worker_init_fn: Optional[Callable[[], None]] = None,
    ):
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0:
            raise ValueError(f"`buffer_size` must be greater than 0, got {buffer_size}.")
        super().__init__(parent)
        self._buffer_size = buffer_size
        self._worker_init_fn = worker_init_fn

    def __str__(self) -> str:
        return f"ProcessPrefetchIterDataset(buffer_size={self._buffer_size})"

    def __iter__(self) -> "ProcessPrefetchDatasetIterator":
        return ProcessPrefetchDatasetIterator(self._parent, self._buffer_size, self._worker_init_fn)


class ProcessPrefetchDatasetIterator(MultiprocessPrefetchDatasetIterator):
    """``ProcessPrefetchIterDataset``'s iterator: one worker; the state is the parent iterator's.

    Args:
      parent: the dataset the worker iterates over.
      buffer_size: outputs computed ahead (> 0).
      worker_init_fn: called with no arguments in the worker.
    """

    def __init__(
        self,
        parent: IterDataset,
        buffer_size: int,
        worker_init_fn: Optional[Callable[[], None]] = None,
    ):
        init = None if worker_init_fn is None else functools.partial(_without_worker_index, worker_init_fn)
        super().__init__(parent, 1, buffer_size, worker_init_fn=init)

    @property
    def buffer_size(self) -> int:
        return self._buffer_size

    def get_state(self) -> Any:
        return super().get_state()["iterators_in_use_states"][0]

    def set_state(self, state: Any) -> None:
        """Restores the parent iterator's ``state`` (as ``get_state()`` returned it).

        Raises:
          InvalidStateError, KeyError, IndexError: as the parent iterator's
            ``set_state`` raises for ``state``; this iterator is left as it was.
        """
        super().set_state(
            {
                "next_index_in_cycle": 0,
                "next_index_in_datasets": 1,
                "iterators_in_use_indices": [0],
                "iterators_in_use_states": [state],
                "exhausted": [0],
                "future_states": {},
            }
        )

    def __str__(self) -> str:
        return f"ProcessPrefetchDatasetIterator(buffer_size={self._buffer_size})"


def multiprocess_prefetch(
    ds: IterDataset,
    num_workers: int = 0,
    buffer_size: int = 1,
    worker_init_fn: Optional[Callable[[int, int], None]] = None,
    sequential_slice: bool = False,
) -> IterDataset:
    """``ds`` computed in ``num_workers`` processes, each on a slice (grain's function).

    The same as ``ds.mp_prefetch(MultiprocessingOptions(num_workers,
    per_worker_buffer_size=buffer_size), worker_init_fn, sequential_slice)``:
    the same outputs and states (see the module docstring).

    Args:
      ds: the dataset to compute in worker processes.
      num_workers: worker processes; 0 returns ``ds`` itself.
      buffer_size: outputs each worker computes ahead.
      worker_init_fn: called in each worker as ``fn(worker_index, worker_count)``.
      sequential_slice: each worker reads a contiguous slice (see ``mp_prefetch``).

    Returns:
      The dataset computed in the workers (``ds`` where ``num_workers`` is 0).
    """
    if num_workers == 0:
        return ds
    from grainlike.dataset.options import MultiprocessingOptions

    options = MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=buffer_size)
    return ds.mp_prefetch(options, worker_init_fn=worker_init_fn, sequential_slice=sequential_slice)
