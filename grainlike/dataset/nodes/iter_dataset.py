"""``IterDataset``: the dataset that can only be iterated, and the methods that build its stages.

``iter(ds)`` builds a ``DatasetIterator``; each stage is defined in its own module.
"""

from __future__ import annotations

import abc
import functools
import sys
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TypeVar, Union

from grainlike.dataset.nodes.dataset_node import _Dataset
from grainlike.dataset.nodes.map_dataset import MapDataset  # noqa: F401  (the doctests use it)
from grainlike.dataset.nodes.stage_registry import stage_class

T = TypeVar("T")
S = TypeVar("S")


class IterDatasetMeta(abc.ABCMeta):
    """Metaclass of ``IterDataset``: its class-level factories."""

    def mix(
        cls,
        datasets: Union[Sequence["IterDataset"], Mapping[str, "IterDataset"]],
        weights: Union[Sequence[float], Mapping[str, float], None] = None,
    ) -> "IterDataset":
        """Interleaves ``datasets`` in proportion to ``weights``; stops at the first end.

        With a mapping of datasets, a state restores by key.

        Example:
          >>> a, b = MapDataset.range(3).to_iter_dataset(), MapDataset.range(7, 9).to_iter_dataset()
          >>> list(IterDataset.mix([a, b]))
          [0, 7, 1, 8, 2]
        """
        return stage_class("MixedIterDataset")(parents=datasets, proportions=weights)


def _collects_stats(iterator: Any) -> bool:
    """Whether grain would collect execution statistics for ``iterator``: debug mode, or ``STAGE_TIMING``.

    Asked of every new iterator, so it imports nothing: debug mode can only be
    on where ``grainlike.config`` was loaded (a worker process that never
    loaded it imports no statistics modules before its first output).
    """
    config = sys.modules.get("grainlike.core.config")
    if config is not None and config.config.py_debug_mode:
        return True
    options = getattr(getattr(iterator, "_ctx", None), "dataset_options", None)
    return getattr(getattr(options, "execution_tracking_mode", None), "name", None) == "STAGE_TIMING"


def _collecting_stats(iter_fn: Callable) -> Callable:
    """Wraps an ``__iter__``: the iterator it makes collects execution statistics when grain would.

    Decided once per iterator (debug mode, or ``ExecutionTrackingMode.STAGE_TIMING``
    in its options), so that with statistics off its elements cost nothing more.
    """

    @functools.wraps(iter_fn)
    def __iter__(self):
        iterator = iter_fn(self)
        if _collects_stats(iterator):
            from grainlike.dataset import execution_stats

            execution_stats.start_collecting(iterator)
        return iterator

    return __iter__


class IterDataset(_Dataset, Iterable[T], metaclass=IterDatasetMeta):
    """A dataset that can only be iterated; transformations return new datasets."""

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "__iter__" in cls.__dict__:
            cls.__iter__ = _collecting_stats(cls.__dict__["__iter__"])

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Optional[Callable[[Sequence[T]], S]] = None,
    ) -> "IterDataset[S]":
        """Groups consecutive elements, stacked along a new first axis.

        Example:
          >>> [b.tolist() for b in MapDataset.range(5).to_iter_dataset().batch(2)]
          [[0, 1], [2, 3], [4]]
        """
        return stage_class("BatchIterDataset")(self, batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)

    def seed(self, seed: int) -> "IterDataset[T]":
        """Seeds every downstream random stage that is given no seed of its own."""
        return stage_class("WithSeedIterDataset")(self, seed=seed)

    def filter(self, transform: Any) -> "IterDataset[T]":
        """Keeps the elements for which ``transform`` is true.

        Example:
          >>> list(MapDataset.range(5).to_iter_dataset().filter(lambda x: x > 2))
          [3, 4]
        """
        return stage_class("FilterIterDataset")(self, transform)

    def map(self, transform: Any) -> "IterDataset":
        """Applies ``transform`` (a ``MapTransform`` or a callable) to each element."""
        return stage_class("MapIterDataset")(self, transform)

    def random_map(self, transform: Any, *, seed: Optional[int] = None) -> "IterDataset":
        """Applies ``transform(element, rng)``, the rng keyed on the seed and a counter."""
        return stage_class("RandomMapIterDataset")(self, transform, seed=seed)

    def map_with_index(self, transform: Any) -> "IterDataset":
        """Applies ``transform(position, element)``, counting positions from 0."""
        return stage_class("MapWithIndexIterDataset")(self, transform)

    def _flat_map(self, transform: Any) -> "IterDataset":
        """A flat map of this dataset (``apply`` of a flat-map transform)."""
        return stage_class("FlatMapIterDataset")(self, transform)

    def prefetch(self, multiprocessing_options: Any) -> "IterDataset[T]":
        """Deprecated alias of ``mp_prefetch`` (as in grain)."""
        import warnings

        warnings.warn("Please use `mp_prefetch` instead.", DeprecationWarning, stacklevel=2)
        return self.mp_prefetch(multiprocessing_options)

    def mp_prefetch(
        self,
        options: Any = None,
        worker_init_fn: Optional[Callable[[int, int], None]] = None,
        sequential_slice: bool = False,
    ) -> "IterDataset[T]":
        """Computes this dataset in worker processes, each on a slice of it.

        Args:
          options: a ``MultiprocessingOptions``; defaults to 10 workers, as in
            grain. With ``num_workers=0`` this is a no-op.
          worker_init_fn: called in each worker as ``fn(worker_index, worker_count)``
            before it computes anything.
          sequential_slice: grain's experimental option: worker ``w`` of ``W``
            reads a contiguous range of each source instead of the elements
            ``w, w + W, ...`` of ``to_iter_dataset()``; a shuffle above a source
            then shuffles within each worker's range, and a state restores only
            on the same number of workers.

        Warns:
          WorkersDropRemaindersWarning: a ``batch(..., drop_remainder=True)``
            below makes the workers, each batching its own slice, deliver fewer
            elements than without workers (as grain). Batch after ``mp_prefetch``.
        """
        from grainlike.dataset.nodes.options import MultiprocessingOptions

        options = options or MultiprocessingOptions(num_workers=10)
        if options.num_workers == 0:
            return self
        stage = stage_class("MultiprocessPrefetchIterDataset")
        ds = stage(self, options=options, worker_init_fn=worker_init_fn, sequential_slice=sequential_slice)
        # A function the stage's module holds, called here so that its warning names the caller's line.
        stage.warn_if_workers_drop_more(self, options.num_workers, sequential_slice)
        return ds

    @abc.abstractmethod
    def __iter__(self) -> "DatasetIterator[T]":
        """Returns a new iterator over this dataset."""
