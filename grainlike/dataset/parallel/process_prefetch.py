"""grain's ``ProcessPrefetchIterDataset`` and ``multiprocess_prefetch``, on ``mp_prefetch``'s workers.

The ``mp_prefetch`` classes are importable from here too, as from grain's module.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from grainlike.core.errors import is_int
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.parallel.mp_prefetch import MultiprocessPrefetchDatasetIterator, MultiprocessPrefetchIterDataset

__all__ = [
    "MultiprocessPrefetchDatasetIterator",
    "MultiprocessPrefetchIterDataset",
    "ProcessPrefetchDatasetIterator",
    "ProcessPrefetchIterDataset",
    "multiprocess_prefetch",
]


def _without_worker_index(fn: Callable[[], None], worker_index: int, worker_count: int) -> None:
    del worker_index, worker_count  # ProcessPrefetchIterDataset's worker_init_fn takes none.
    fn()


class ProcessPrefetchIterDataset(IterDataset):
    """The parent dataset, computed ahead (unsliced) in one background process (grain's name).

    The iterator's state is the parent iterator's state, as in grain.

    Args:
      parent: the dataset to compute in the background process.
      buffer_size: outputs computed ahead (> 0).
      worker_init_fn: called with no arguments in the process before it loads
        the dataset.

    Raises:
      ValueError: ``buffer_size`` is not positive.

    Example:
      >>> from grainlike.dataset.base import MapDataset
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
        if not is_int(buffer_size) or buffer_size <= 0:
            raise ValueError(f"`buffer_size` must be greater than 0, got {buffer_size}.")
        super().__init__(parent)
        self._buffer_size = buffer_size
        self._worker_init_fn = worker_init_fn

    def __str__(self) -> str:
        return f"ProcessPrefetchIterDataset(buffer_size={self._buffer_size})"

    def __iter__(self) -> "ProcessPrefetchDatasetIterator":
        return ProcessPrefetchDatasetIterator(self._parent, self._buffer_size, self._worker_init_fn)


class ProcessPrefetchDatasetIterator(MultiprocessPrefetchDatasetIterator):
    """``ProcessPrefetchIterDataset``'s iterator (same arguments): one worker; the state is the parent iterator's."""

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
    from grainlike.dataset.nodes.options import MultiprocessingOptions

    options = MultiprocessingOptions(num_workers=num_workers, per_worker_buffer_size=buffer_size)
    return ds.mp_prefetch(options, worker_init_fn=worker_init_fn, sequential_slice=sequential_slice)
