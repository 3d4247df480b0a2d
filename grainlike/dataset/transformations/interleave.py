"""``InterleaveIterDataset``: the elements of up to ``cycle_length`` datasets in turn.

Each of the ``cycle_length`` slots iterates one dataset; ``next()`` asks the slots in
turn. A slot whose iterator ended takes the next dataset not yet started at its next
turn. The order never depends on timing: threads only build iterators and compute
elements ahead of their turn.

The state is grain's::

    {"next_index_in_cycle": slot of the next element,
     "next_index_in_datasets": index of the next dataset not yet started,
     "iterators_in_use_indices": the dataset index of each slot,
     "iterators_in_use_states": each slot's iterator state (None: empty slot),
     "exhausted": 1 for each slot whose iterator has ended, else 0,
     "future_states": {}}
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Optional, Sequence, Union

from grainlike.core.errors import StateIndexError, StateTypeError, check_int
from grainlike.dataset.nodes.element_spec import get_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator, get_next_index, set_next_index
from grainlike.dataset.nodes.map_dataset import MapDataset
from grainlike.dataset.nodes.options import ReadOptions
from grainlike.dataset.nodes.state import interleave_state, non_negative_int


def _make_iterator(
    ds: Union[IterDataset, MapDataset], interleave: "weakref.ref[InterleaveDatasetIterator]", start_prefetch: bool
) -> DatasetIterator:
    """An iterator of one interleaved dataset, computing ahead as grain's does.

    ``interleave`` is weak: the interleave iterator owns the thread that calls this.
    """
    owner = interleave()
    if owner is None:
        raise RuntimeError("The InterleaveDatasetIterator building this iterator has been garbage collected.")
    buffer_size = owner._iter_buffer_size
    ctx = owner._ctx
    del owner
    if isinstance(ds, MapDataset):
        iter_ds = ds.to_iter_dataset()
    elif isinstance(ds, IterDataset):
        from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchIterDataset

        iter_ds = ThreadPrefetchIterDataset(ds, prefetch_buffer_size=buffer_size)
    else:
        raise TypeError(
            f"InterleaveIterDataset interleaves MapDatasets and IterDatasets, got {ds!r} of type {type(ds).__name__}"
        )
    iterator = iter_ds.__iter__()
    # Options set downstream of the interleave reach the interleaved pipelines too.
    iterator._ctx.dataset_options = ctx.dataset_options.merge(iterator._ctx.dataset_options)
    if start_prefetch:
        iterator.start_prefetch()
    return iterator


class InterleaveDatasetIterator(DatasetIterator):
    """Iterates over the interleaved datasets; see the module docstring."""

    def __init__(self, interleave: "InterleaveIterDataset"):
        # Not parents: ``datasets`` may be a MapDataset building datasets lazily.
        super().__init__()
        datasets = interleave._datasets
        self._datasets = datasets
        self._iter_buffer_size = interleave._iter_buffer_size
        read_options = ReadOptions(
            num_threads=interleave._num_make_iter_threads, prefetch_buffer_size=interleave._make_iter_buffer_size
        )
        self._make_iters = (
            MapDataset.source(datasets)
            .map(functools.partial(_make_iterator, interleave=weakref.ref(self), start_prefetch=True))
            .to_iter_dataset(read_options)
            .__iter__()
        )
        self._cycle_length = min(interleave._cycle_length, len(datasets))
        self._next_index_in_cycle = 0
        self._next_index_in_datasets = 0
        self._in_use_indices: list = list(range(self._cycle_length))
        self._in_use: list[Optional[DatasetIterator]] = [None] * self._cycle_length
        self._exhausted_state: list[Optional[dict]] = [None] * self._cycle_length
        self._started = False
        # Set only by elastic restores (grain's set_shard_states): states of
        # datasets not yet started, applied when their turn comes.
        self._future_states: dict = {}

    def __next__(self):
        self._assert_not_closed()
        self._started = True
        if not self._cycle_length:
            raise StopIteration  # No datasets (grain raises IndexError).
        while True:
            slot = self._next_index_in_cycle
            iterator = self._in_use[slot]
            if iterator is not None:
                try:
                    element = iterator.__next__()
                except StopIteration:
                    self._exhausted_state[slot] = iterator.get_state()
                    self._in_use[slot] = None
                    iterator.close()
                    self._next_index_in_cycle = (slot + 1) % self._cycle_length
                    continue
                self._next_index_in_cycle = (slot + 1) % self._cycle_length
                return element
            if self._next_index_in_datasets < len(self._datasets):
                iterator = next(self._make_iters)
                index = self._next_index_in_datasets
                self._in_use[slot] = iterator
                self._exhausted_state[slot] = None
                self._in_use_indices[slot] = index
                if index in self._future_states:
                    iterator.set_state(self._future_states.pop(index))
                self._next_index_in_datasets += 1
            elif not any(it is not None for it in self._in_use):
                raise StopIteration
            else:
                self._next_index_in_cycle = (slot + 1) % self._cycle_length

    def get_state(self) -> dict:
        states: list = [None] * self._cycle_length
        for slot in range(self._cycle_length):
            iterator = self._in_use[slot]
            if iterator is not None:
                states[slot] = iterator.get_state()
            elif self._exhausted_state[slot] is not None:
                states[slot] = self._exhausted_state[slot]
            elif self._next_index_in_datasets >= len(self._datasets):
                break
            else:
                # A state names the iterator of every slot, so the slots not yet
                # filled are filled now, in the order next() would fill them.
                if self._started:
                    iterator = next(self._make_iters)
                else:
                    iterator = _make_iterator(
                        self._datasets[self._next_index_in_datasets], weakref.ref(self), start_prefetch=False
                    )
                self._in_use[slot] = iterator
                states[slot] = iterator.get_state()
                self._in_use_indices[slot] = self._next_index_in_datasets
                self._next_index_in_datasets += 1
        if not self._started:
            self._make_iters.set_state({"next_index": self._next_index_in_datasets})
        return {
            "next_index_in_cycle": self._next_index_in_cycle,
            "next_index_in_datasets": self._next_index_in_datasets,
            "iterators_in_use_indices": list(self._in_use_indices),
            "iterators_in_use_states": states,
            # Ints, not bools, as grain writes them.
            "exhausted": [int(s is not None) for s in self._exhausted_state],
            "future_states": self._future_states,
        }

    def set_state(self, state: dict) -> None:
        interleave_state(state, self, slots=self._cycle_length)
        n = len(self._datasets)
        non_negative_int(state, "next_index_in_datasets", self, upper=n)
        cycle = non_negative_int(state, "next_index_in_cycle", self)
        if self._cycle_length and cycle >= self._cycle_length:
            raise StateIndexError(
                f"{self}: state['next_index_in_cycle'] = {cycle} is not a slot of a cycle of {self._cycle_length}"
            )
        for index in state["iterators_in_use_indices"]:
            if not 0 <= index < max(n, 1):
                raise StateTypeError(f"{self}: state['iterators_in_use_indices'] holds {index!r}, not a dataset index")
        exhausted = state["exhausted"]
        for slot, (index, it_state) in enumerate(
            zip(state["iterators_in_use_indices"], state["iterators_in_use_states"])
        ):
            # A slot restored in use or empty has no exhausted state left from before.
            if exhausted[slot] == 0 or it_state is None:
                self._exhausted_state[slot] = None
            if it_state is None:
                if self._in_use[slot] is not None:
                    self._in_use[slot].close()
                self._in_use[slot] = None
            elif exhausted[slot] == 0:
                iterator = self._in_use[slot]
                if iterator is None or index != self._in_use_indices[slot]:
                    if iterator is not None:
                        iterator.close()
                    iterator = _make_iterator(self._datasets[index], weakref.ref(self), start_prefetch=False)
                if it_state:
                    iterator.set_state(it_state)
                self._in_use[slot] = iterator
            else:
                if self._in_use[slot] is not None:
                    self._in_use[slot].close()
                self._exhausted_state[slot] = it_state
                self._in_use[slot] = None
        self._make_iters.set_state({"next_index": state["next_index_in_datasets"]})
        self._next_index_in_cycle = state["next_index_in_cycle"]
        self._next_index_in_datasets = state["next_index_in_datasets"]
        self._in_use_indices = list(state["iterators_in_use_indices"])
        self._future_states = dict(state.get("future_states", {}))

    def _get_next_index(self) -> int:
        if len(self._datasets) == 1:
            iterator = self._in_use[0]
            return 0 if iterator is None else get_next_index(iterator)
        raise NotImplementedError(
            "get_next_index is not supported for InterleaveDatasetIterator with more than one dataset."
        )

    def _set_next_index(self, index: int) -> None:
        if len(self._datasets) != 1:
            raise NotImplementedError(
                "set_next_index is not supported for InterleaveDatasetIterator with more than one dataset."
            )
        self.get_state()  # Builds the only iterator.
        set_next_index(self._in_use[0], index)

    def start_prefetch(self) -> None:
        for iterator in self._in_use:
            if iterator is not None:
                iterator.start_prefetch()

    def _close(self) -> None:
        """Stops building iterators and closes the iterators in use."""
        self._make_iters.close()
        for iterator in self._in_use:
            if iterator is not None:
                iterator.close()

    def __str__(self) -> str:
        return f"InterleaveDatasetIterator([{len(self._datasets)} datasets], cycle_length={self._cycle_length})"


class InterleaveIterDataset(IterDataset):
    """Interleaves the elements of ``datasets``, at most ``cycle_length`` at a time.

    With ``cycle_length`` at least ``len(datasets)`` the datasets are mixed in equal
    proportions; with 1 they are chained. ``datasets`` may be a MapDataset of
    datasets (built when their turn comes). Under ``mp_prefetch`` each worker
    interleaves its slice of ``datasets``, which parallelises sources that can only
    be iterated (files).

    Args:
      datasets: the IterDatasets and MapDatasets to interleave.
      cycle_length: how many datasets are iterated at once.
      num_make_iter_threads: threads that build the next datasets' iterators ahead.
      make_iter_buffer_size: how many iterators are built ahead.
      iter_buffer_size: elements each IterDataset's iterator computes ahead, in a
        thread of its own.

    Raises:
      ValueError: ``cycle_length`` is not a positive int.

    Example:
      >>> from grainlike.dataset import MapDataset
      >>> dss = [MapDataset.range(3), MapDataset.range(10, 12), MapDataset.range(20, 21)]
      >>> list(InterleaveIterDataset(dss, cycle_length=2))
      [0, 10, 1, 11, 2, 20]
    """

    @property
    def _element_spec(self) -> Any:
        # The interleaved datasets are assumed to share one element spec (as grain).
        return get_element_spec(self._datasets[0])

    def __init__(
        self,
        datasets: Sequence[Union[IterDataset, MapDataset]],
        *,
        cycle_length: int,
        num_make_iter_threads: int = 1,
        make_iter_buffer_size: int = 1,
        iter_buffer_size: int = 1,
    ):
        super().__init__()
        self._datasets = datasets
        # grain fails later, on the first next() (ZeroDivisionError).
        self._cycle_length = check_int("cycle_length", cycle_length, 1)
        self._num_make_iter_threads = num_make_iter_threads
        self._make_iter_buffer_size = make_iter_buffer_size
        self._iter_buffer_size = iter_buffer_size

    def __iter__(self) -> InterleaveDatasetIterator:
        return InterleaveDatasetIterator(self)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Interleaves only the datasets of ``sl`` (a worker's share), in place."""
        del sequential_slice  # A slice of the datasets is one either way.
        self._datasets = self._datasets[sl]

    def __str__(self) -> str:
        return f"InterleaveIterDataset([{len(self._datasets)} datasets], cycle_length={self._cycle_length})"
