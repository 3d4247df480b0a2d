"""``grainlike.ray.prefetch``: ``mp_prefetch`` with its workers as Ray actors.

The dataset and its iterator are ``mp_prefetch``'s (``MultiprocessPrefetchIterDataset``
and its iterator): the same worker slices, round-robin, ``get_state()`` /
``set_state()`` (also onto another number of workers), error handling; only the
pool differs (``grainlike.ray.pool.RayWorkerPool`` instead of worker processes of
this host). A state saved by one restores in the other.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping, Optional

from grainlike.dataset.nodes.dataset_node import parents
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.parallel.mp_prefetch import MultiprocessPrefetchDatasetIterator, MultiprocessPrefetchIterDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions
from grainlike.ray.options import RayOptions
from grainlike.ray.pool import RayWorkerPool
from grainlike.workers.liveness import DEFAULT_STALL_TIMEOUT_S


class RayPrefetchIterDataset(MultiprocessPrefetchIterDataset):
    """The parent dataset, computed by ``options.num_workers`` Ray actors (see ``prefetch``).

    Args:
      parent, options, worker_init_fn, error_ends_worker, sequential_slice:
        ``MultiprocessPrefetchIterDataset``'s (``options.per_worker_buffer_size``,
        ``warm_start`` and ``enable_profiling`` have no effect here: see
        ``RayOptions`` for what each call carries).
      ray_options: where and how the actors run.
    """

    def __init__(
        self,
        parent: IterDataset,
        options: Any,
        worker_init_fn: Optional[Callable[[int, int], None]] = None,
        *,
        error_ends_worker: bool = True,
        sequential_slice: bool = False,
        ray_options: RayOptions = RayOptions(),
    ):
        super().__init__(
            parent,
            options,
            worker_init_fn,
            error_ends_worker=error_ends_worker,
            sequential_slice=sequential_slice,
        )
        if not isinstance(ray_options, RayOptions):
            raise TypeError(f"ray_options must be a grainlike.ray.RayOptions, got {ray_options!r}")
        self._ray_options = ray_options

    def __str__(self) -> str:
        return f"RayPrefetchIterDataset(num_workers={self._num_workers})"

    def __iter__(self) -> "RayPrefetchDatasetIterator":
        return RayPrefetchDatasetIterator(
            self._parent,
            self._num_workers,
            self._buffer_size,
            worker_init_fn=self._worker_init_fn,
            error_ends_worker=self._error_ends_worker,
            stall_timeout_s=getattr(self._options, "stall_timeout_s", DEFAULT_STALL_TIMEOUT_S),
            sequential_slice=self._sequential_slice,
            ray_options=self._ray_options,
        )


class RayPrefetchDatasetIterator(MultiprocessPrefetchDatasetIterator):
    """``mp_prefetch``'s iterator over Ray actors: its state, restore and errors, with Ray's transport.

    The actors start at the first ``next()`` (or ``start_prefetch()``) and are
    killed by ``close()``, or when the iterator is garbage collected. A worker
    whose actor dies (its process killed, its node gone) is restarted from its
    last delivered output and the iteration goes on.
    """

    def __init__(self, parent: IterDataset, num_workers: int, buffer_size: int, *, ray_options: RayOptions, **kwargs: Any):
        super().__init__(parent, num_workers, buffer_size, **kwargs)
        self._ray_options = ray_options

    def _new_pool(self, *args: Any, **kwargs: Any) -> RayWorkerPool:
        return RayWorkerPool(*args, options=self._ray_options, **kwargs)

    def __str__(self) -> str:
        return f"RayPrefetchDatasetIterator(num_workers={self._w})"


def prefetch(
    dataset: IterDataset,
    num_workers: int,
    *,
    address: Optional[str] = None,
    actor_options: Optional[Mapping[str, Any]] = None,
    worker_init_fn: Optional[Callable[[int, int], None]] = None,
    sequential_slice: bool = False,
    stall_timeout_s: Optional[float] = DEFAULT_STALL_TIMEOUT_S,
    elements_per_call: int = RayOptions.elements_per_call,
    bytes_per_call: int = RayOptions.bytes_per_call,
    seconds_per_call: float = RayOptions.seconds_per_call,
    calls_in_flight: int = RayOptions.calls_in_flight,
) -> IterDataset:
    """``dataset`` computed by ``num_workers`` Ray actors: ``mp_prefetch``'s elements, order and state.

    Worker ``w`` of ``num_workers`` is a Ray actor that iterates over the slice
    of ``dataset`` that ``dataset.mp_prefetch(MultiprocessingOptions(num_workers=
    num_workers))``'s worker ``w`` would, from the same state; the outputs are
    taken round-robin, and ``get_state()`` is ``mp_prefetch``'s: a state saved
    by either restores in the other, also onto another number of workers.

    Args:
      dataset: an ``IterDataset`` that ``mp_prefetch`` accepts (a MapDataset
        turned into an IterDataset upstream). Its stages and transforms are sent
        to the actors pickled (cloudpickle), as to ``mp_prefetch``'s workers;
        every node must be able to import the modules they name (grainlike
        included: install it on the nodes or pass ``runtime_env``).
      num_workers: actors (> 0).
      address: the Ray cluster (``ray.init(address=...)``); None: Ray as already
        initialised in this process, else ``RAY_ADDRESS``, else a local Ray
        instance bound to 127.0.0.1 without a dashboard, started at the first
        ``next()``.
      actor_options: Ray actor options for each worker (``num_cpus``,
        ``resources``, ``memory``, ``runtime_env``, ``scheduling_strategy``);
        defaults: one CPU each, spread over the nodes.
      worker_init_fn: called in each actor as ``fn(worker_index, worker_count)``
        before it loads the dataset.
      sequential_slice: as ``mp_prefetch``'s.
      stall_timeout_s: a worker that returns nothing for this long raises
        ``WorkerStalledError`` (its first call gets at least 10 minutes, for Ray to
        place and start its actor); None turns the check off.
      elements_per_call, bytes_per_call, seconds_per_call, calls_in_flight:
        what each call to an actor carries and how far ahead each computes (see
        ``RayOptions``).

    Returns:
      An ``IterDataset`` (``RayPrefetchIterDataset``) whose iterators start their
      actors at the first ``next()`` and kill them at ``close()`` or when dropped.

    Raises:
      ValueError: ``num_workers`` is not positive, or an option is out of range.
    """
    if not isinstance(dataset, IterDataset):
        raise TypeError(
            f"grainlike.ray.prefetch takes an IterDataset, got {type(dataset).__name__}; call "
            "to_iter_dataset() on a MapDataset first"
        )
    options = MultiprocessingOptions(num_workers=num_workers, stall_timeout_s=stall_timeout_s)
    ray_options = RayOptions(
        address=address,
        actor_options=dict(actor_options or {}),
        elements_per_call=elements_per_call,
        bytes_per_call=bytes_per_call,
        seconds_per_call=seconds_per_call,
        calls_in_flight=calls_in_flight,
    )
    return RayPrefetchIterDataset(
        dataset, options, worker_init_fn, sequential_slice=sequential_slice, ray_options=ray_options
    )


def on_ray(dataset: IterDataset, ray_options: RayOptions) -> IterDataset:
    """``dataset`` with its ``mp_prefetch`` stage computed by Ray actors instead (same elements and state).

    The stages above it are copied (shallowly), so ``dataset`` itself is left as it is.

    Raises:
      ValueError: ``dataset`` has no ``mp_prefetch`` stage.
    """
    found = _replaced(dataset, ray_options)
    if found is None:
        raise ValueError(f"{dataset} has no mp_prefetch stage to run on Ray")
    return found


def _replaced(ds: Any, ray_options: RayOptions) -> Optional[IterDataset]:
    if isinstance(ds, RayPrefetchIterDataset):
        return ds
    if isinstance(ds, MultiprocessPrefetchIterDataset):
        return RayPrefetchIterDataset(
            parents(ds)[0],
            ds._options,
            ds._worker_init_fn,
            error_ends_worker=ds._error_ends_worker,
            sequential_slice=ds._sequential_slice,
            ray_options=ray_options,
        )
    if not isinstance(ds, IterDataset):
        return None  # A MapDataset holds no workers.
    new_parents, found = [], False
    for parent in parents(ds):
        replaced = _replaced(parent, ray_options)
        found = found or replaced is not None
        new_parents.append(parent if replaced is None else replaced)
    if not found:
        return None
    out = copy.copy(ds)
    out._parents = tuple(new_parents)
    return out
