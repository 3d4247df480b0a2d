"""What each ``mp_prefetch`` worker runs: its slice of the parent dataset (``WorkerSliceTask``).

For error reports it also names the stages and user transforms that made an
output, and the first stage that cannot be pickled.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterator, Optional

import cloudpickle

from grainlike.core import pickling
from grainlike.core.errors import add_note
from grainlike.core.protocols import TakesAllocator
from grainlike.core.shared_memory_array import as_delivered
from grainlike.core.transforms import transform_name
from grainlike.core.tree import Allocator
from grainlike.dataset.nodes import worker_slice
from grainlike.dataset.transformations.batch import BatchIterDataset
from grainlike.dataset.nodes.dataset_node import _Dataset, parents, walk
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator, MultiprocessingContext


def _user_transforms(ds: Any) -> list:
    """The user transforms of ``ds``'s pipeline, nearest to its output first, each once."""
    found, seen = [], set()
    for node in walk(ds):
        if isinstance(node, _Dataset):
            for transform in reversed(node.user_transforms()):
                if id(transform) not in seen:
                    seen.add(id(transform))
                    found.append(transform)
    return found


def _pickling_error(ds: Any, error: Exception) -> Exception:
    """The error of the first stage (parents first) that cannot be pickled, as grain.

    Where one of the stage's user transforms cannot be pickled by itself, a note
    names it (class or function and where it was defined).
    """
    for parent in parents(ds):
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


def snapshot(state: Any) -> Any:
    """A copy of ``state`` that later steps of the iterator cannot change (cheap for a flat dict of scalars)."""
    if type(state) is dict:
        for v in state.values():
            if type(v) not in _SCALARS:
                return copy.deepcopy(state)
        return dict(state)
    return copy.deepcopy(state)


class WorkerSliceTask:
    """A ``WorkerTask``: worker ``w`` iterates over its slice of the parent dataset.

    States are the sliced iterator's states; None starts a fresh iterator. The
    dataset travels as bytes of its own and is loaded after ``worker_init_fn``
    has run in the worker, as in grain (without one, as the task is loaded).
    ``worker_init_fn`` runs once per process; each ``outputs`` call (a reset
    makes another) iterates over a fresh copy of the stages.
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
        self._worker_dataset: Optional[IterDataset] = None  # the copy outputs() iterates, for describe_output
        self._initialized = False  # worker_init_fn has run in this process
        self._iterator: Optional[Any] = None  # The one outputs() is iterating, in a worker.
        # The DatasetOptions of the whole pipeline, including those set after
        # mp_prefetch: the workers' stages follow them too, as in grain.
        self.dataset_options: Any = None
        # The consumer's directory for the workers' execution statistics (``worker_stats``), if collected.
        self.stats_dir: Optional[str] = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        if self._dataset_bytes is None:
            state["_dataset_bytes"] = pickling.dumps(self._parent)
        state["_parent"] = None
        state["_worker_dataset"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._worker_init_fn is None:
            # Loaded with the task: a worker reports itself loaded (warm start) only once this is.
            self._parent = cloudpickle.loads(self._dataset_bytes)

    def _dataset(self) -> IterDataset:
        """A copy of the parent dataset, this worker's to slice."""
        if self._parent is None:  # Loaded after the worker_init_fn, once.
            self._parent = cloudpickle.loads(self._dataset_bytes)
        # The stages only (what slicing changes), not the sources and transforms.
        return worker_slice.copy_stages(self._parent, self._sequential_slice)

    def outputs(
        self, worker_index: int, worker_count: int, state: Any, alloc: Optional[Allocator]
    ) -> Iterator[tuple[Any, Any]]:
        if self._worker_init_fn is not None and not self._initialized:
            self._initialized = True
            self._worker_init_fn(worker_index, worker_count)
        ds = self._dataset()
        self._worker_dataset = ds
        if worker_count > 1:
            worker_slice.set_slice(ds, slice(worker_index, None, worker_count), self._sequential_slice)
        # The parent's batches are the outputs: stack them in shared memory where grain's
        # workers do (a batch at the top with several workers; a DataLoader's with any),
        # all of it, whatever min_shm_size says. Elsewhere grain stacks in ordinary memory,
        # in np.stack's layout, and the hand-off copies its large leaves into shared memory.
        stacks = isinstance(ds, TakesAllocator) and (worker_count > 1 or not isinstance(ds, BatchIterDataset))
        if alloc is not None and stacks:
            ds.set_allocator(alloc)
        it = ds.__iter__()
        if isinstance(it, DatasetIterator):
            # Random stages on iterators draw per process (grain's mp_context).
            ctx = it._ctx
            ctx.mp_context = MultiprocessingContext(process_index=worker_index, process_count=worker_count)
            if self.dataset_options is not None:
                ctx.dataset_options = self.dataset_options.merge(ctx.dataset_options)
        # The consumer gets grain's element types: its workers' arrays are SharedMemoryArrays.
        min_shm_size = it._ctx.dataset_options.min_shm_size if isinstance(it, DatasetIterator) and not stacks else 0
        reporter = self._reporter(it, worker_index)
        self._iterator = it
        try:
            if state is not None:
                it.set_state(state)
            while True:
                try:
                    element = next(it)
                except StopIteration:
                    if reporter is not None:
                        reporter.write()  # Before the consumer hears of the end: it counts every element.
                    return
                yield snapshot(it.get_state()), as_delivered(element, min_shm_size)
        finally:
            if reporter is not None:
                reporter.stop()
            self._iterator = None
            it.close()

    def _reporter(self, it: Any, worker_index: int) -> Any:
        """Where the consumer collects execution statistics: this worker's pipeline collects them too and reports them."""
        if self.stats_dir is None or not isinstance(it, DatasetIterator):
            return None
        from grainlike.dataset import execution_stats
        from grainlike.dataset.parallel.worker_stats import Reporter

        if not isinstance(it.__dict__.get("_stats"), execution_stats.ExecutionStats):
            execution_stats.start_collecting(it)
        return Reporter(self.stats_dir, worker_index, it._stats)

    def interrupt(self) -> None:
        """Closes the iterator ``outputs`` is in, from another thread (the worker is stopping).

        Its read threads end after the reads they are in; the thread in
        ``outputs`` gets an error or the end, which nobody reads.
        """
        it = self._iterator
        if it is not None:
            it.close()

    def end_state(self, worker_index: int, worker_count: int, state: Any) -> Any:
        # As grain: an exhausted worker keeps the state of its last output.
        return state

    def describe_output(self, worker_index: int, worker_count: int, before: Any, after: Any) -> str:
        """The stages that made an output (nearest first) and the worker's states around it."""
        stages, ds = [], self._worker_dataset or self._parent
        while ds is not None and len(stages) < 4:
            stages.append(ds.describe() if isinstance(ds, _Dataset) else str(ds))  # with the transform's file:line
            ds = parents(ds)[0] if len(parents(ds)) == 1 else None
        transforms = _user_transforms(self._worker_dataset or self._parent)
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
