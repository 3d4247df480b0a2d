"""Batch stages: consecutive elements stacked leaf by leaf along a new first axis."""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar

import numpy as np

from grainlike.core import tree
from grainlike.core.shared_memory_array import SharedMemoryArray
from grainlike.core.errors import add_note
from grainlike.dataset.dataset_node import walk
from grainlike.dataset.iter_dataset import IterDataset
from grainlike.dataset.iterator import DatasetIterator
from grainlike.dataset.map_dataset import MapDataset
from grainlike.dataset.map import PassThroughStateIterator, note_iterator
from grainlike.dataset.prefetch import PrefetchDatasetIterator


S = TypeVar("S")
T = TypeVar("T")


class BatchFn(Protocol[S, T]):
    """A ``batch_fn`` whose ``output_spec`` lets ``element_spec`` describe its batches (grain's ``BatchFn``)."""

    def __call__(self, elements: Sequence[S]) -> T:
        """Batches ``elements``."""

    def output_spec(self, input_spec: Any, batch_size: int, drop_remainder: bool) -> Any:
        """The element spec of this function's batches, given the elements' spec."""


def _to_shared_memory(leaf: np.ndarray) -> np.ndarray:
    if isinstance(leaf, SharedMemoryArray) or leaf.dtype.hasobject or leaf.size == 0:
        # Objects are pointers into this process; a segment cannot be empty.
        return leaf
    out = SharedMemoryArray(leaf.shape, leaf.dtype)
    np.copyto(out, leaf, casting="no")
    return out


def _shared_memory_alloc(shape: tuple, dtype: np.dtype) -> np.ndarray:
    return SharedMemoryArray(shape, dtype) if math.prod(shape) else np.empty(shape, dtype)


def make_batch(values: Sequence[T], *, output_to_shared_memory: bool = False) -> T:
    """Stacks ``values`` leaf by leaf along a new first axis: what ``batch`` does by default.

    Args:
      values: one or more elements of the same structure and leaf shapes
        (differing dtypes are promoted, as ``np.stack`` does).
      output_to_shared_memory: stack into ``SharedMemoryArray``s (named segments
        another process can map); object and empty leaves stay plain arrays.

    Raises:
      ValueError: no values, or elements that differ in structure or shape.

    Example:
      >>> make_batch([{"x": 1}, {"x": 2}])["x"].tolist()
      [1, 2]
    """
    if not len(values):
        raise ValueError("Cannot batch 0 values.")
    if not output_to_shared_memory:
        return tree.stack(list(values))
    # Leaves of one shape and dtype are stacked straight into their segment; the
    # others (promoted dtypes, Python scalars, strings) are stacked, then copied.
    stacked = tree.stack(list(values), _shared_memory_alloc)
    return tree.map_structure(_to_shared_memory, stacked)


def batch_and_pad(values: Sequence[Any], *, batch_size: int, pad_value: Any = 0) -> Any:
    """Stacks ``values`` and pads the batch with ``pad_value`` up to ``batch_size``.

    Pass it as ``batch_fn`` (with ``functools.partial``) to keep a short last
    batch at full size instead of dropping it.

    Example:
      >>> batch_and_pad([1, 2], batch_size=4).tolist()
      [1, 2, 0, 0]

    Raises:
      ValueError: no values, or more than ``batch_size``.
    """
    if not values:
        raise ValueError("Cannot batch 0 values.")
    if len(values) > batch_size:
        raise ValueError(f"Cannot batch {len(values)} values to {batch_size}.")
    stacked = tree.stack(list(values))
    missing = batch_size - len(values)
    if missing == 0:
        return stacked
    return tree.map_structure(
        lambda x: np.concatenate([x, np.full((missing,) + x.shape[1:], pad_value, x.dtype)]), stacked
    )


def discarding_stage(ds: MapDataset) -> Optional[MapDataset]:
    """A stage of ``ds``'s pipeline that can leave elements None (filter, flat_map), or None."""
    from grainlike.dataset.filter import FilterMapDataset
    from grainlike.dataset.flatmap import FlatMapMapDataset

    return next((node for node in walk(ds) if isinstance(node, (FilterMapDataset, FlatMapMapDataset))), None)


class _Batcher:
    """Turns a list of elements into a batch: ``batch_fn``, or stacking into ``alloc``'s arrays."""

    def __init__(self, batch_fn: Optional[Callable[[Sequence[Any]], Any]]):
        # make_batch is the default: it keeps the stacking fast path and element_spec.
        self.batch_fn = None if batch_fn is make_batch else batch_fn
        self.alloc: Optional[tree.Allocator] = None
        self.to_shared_memory = False

    def enable_shared_memory_output(self) -> None:
        if self.batch_fn is None:
            self.to_shared_memory = True
        elif callable(getattr(self.batch_fn, "enable_shared_memory_output", None)):
            self.batch_fn.enable_shared_memory_output()

    def __call__(self, values: list) -> Any:
        if self.batch_fn is not None:
            return self.batch_fn(values)
        if self.to_shared_memory:
            return make_batch(values, output_to_shared_memory=True)
        return tree.stack(values, self.alloc)


class _BatchingStage:
    """What both batch stages share: their arguments and how their batches are stacked."""

    def __init__(
        self,
        parent: Any,
        batch_size: int,
        drop_remainder: bool = False,
        batch_fn: Optional[Callable[[Sequence[Any]], Any]] = None,
    ):
        super().__init__(parent)
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size!r}.")
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._batcher = _Batcher(batch_fn)

    def __str__(self) -> str:
        return f"{type(self).__name__}(batch_size={self._batch_size}, drop_remainder={self._drop_remainder})"

    def user_transforms(self) -> tuple:
        return () if self._batcher.batch_fn is None else (self._batcher.batch_fn,)

    def set_allocator(self, alloc: Optional[tree.Allocator]) -> None:
        """Stacks leaves into arrays from ``alloc(shape, dtype)`` (None: numpy)."""
        self._batcher.alloc = alloc

    def enable_shared_memory_output(self) -> None:
        """Makes batches of ``SharedMemoryArray``s (grain's method), asking a custom ``batch_fn`` too.

        grainlike's own workers need none of this: they hand batches over in
        anonymous shared memory.
        """
        self._batcher.enable_shared_memory_output()


class BatchMapDataset(_BatchingStage, MapDataset):
    """Element ``i`` stacks elements ``[i * b, (i + 1) * b)`` of one parent epoch.

    Each epoch is batched on its own (the last batch of an epoch may be short);
    repeat before batching to batch across epochs.

    Raises:
      ValueError: ``batch_size <= 0``, or a filter upstream (a MapDataset cannot
        batch elements that may be missing; batch after ``to_iter_dataset()``).
    """

    def __init__(
        self,
        parent: MapDataset,
        batch_size: int,
        drop_remainder: bool = False,
        batch_fn: Optional[Callable[[Sequence[Any]], Any]] = None,
    ):
        super().__init__(parent, batch_size, drop_remainder, batch_fn)
        node = discarding_stage(parent)
        if node is not None:
            from grainlike.dataset.filter import FilterMapDataset

            # grain's wording (its tests match it), then the stage itself.
            what, verb = (
                ("`MapDataset.filter`", "`filter`")
                if isinstance(node, FilterMapDataset)
                else ("`FlatMapMapDataset`", "`FlatMapMapDataset`")
            )
            raise ValueError(
                f"`MapDataset.batch` can not follow {what} because {verb} can discard "
                "elements. Convert `MapDataset` to `IterDataset` with "
                f"`to_iter_dataset()` before calling `batch`. The stage: {node}."
            )
        n = len(parent)
        self._length = n // batch_size if drop_remainder else math.ceil(n / batch_size)

    def __len__(self) -> int:
        return self._length

    def _parent_range(self, index: int) -> range:
        epoch, in_epoch = divmod(index, self._length)
        n = len(self._parent)
        start = in_epoch * self._batch_size
        stop = min(n, start + self._batch_size)
        return range(start + epoch * n, stop + epoch * n)

    def _batch(self, values: list, index: int) -> Any:
        try:
            return self._batcher(values)
        except Exception as e:
            add_note(e, f"grainlike: in {self} while making batch {index}")
            raise

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._batch(list(self._parent._getitems(self._parent_range(index))), index)

    def _getitems(self, indices: Sequence[int]) -> list:
        ranges = [self._parent_range(i) for i in indices]
        flat = [j for r in ranges for j in r]
        values = self._parent._getitems(flat)
        out, at = [], 0
        for i, r in zip(indices, ranges):
            out.append(self._batch(list(values[at : at + len(r)]), i))
            at += len(r)
        return out


class _BatchDatasetIterator(PassThroughStateIterator):
    def __init__(self, parent: DatasetIterator, batch_size: int, drop_remainder: bool, batcher: _Batcher):
        super().__init__(parent)
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._batcher = batcher
        # to_iter_dataset()'s reading hands over a batch's elements in a few calls.
        self._take = parent.take if isinstance(parent, PrefetchDatasetIterator) else None

    def _next_values(self) -> list:
        """The next ``batch_size`` elements of the parent, or those left."""
        take = self._take
        if take is None:
            return list(itertools.islice(self._parent, self._batch_size))
        size = self._batch_size
        values: list = []
        try:
            while len(values) < size:
                values += take(size - len(values))
        except StopIteration:
            pass
        return values

    def __next__(self):
        parent = self._parent
        values = self._next_values()
        if not values or (self._drop_remainder and len(values) < self._batch_size):
            raise StopIteration
        try:
            return self._batcher(values)
        except Exception as e:
            note_iterator(e, self, parent)
            raise

    def _get_next_index(self) -> int:
        return (self._parent._get_next_index() + self._batch_size - 1) // self._batch_size

    def _set_next_index(self, index: int) -> None:
        self._parent._set_next_index(index * self._batch_size)

    def __str__(self) -> str:
        return f"BatchDatasetIterator(batch_size={self._batch_size}, drop_remainder={self._drop_remainder})"


class BatchIterDataset(_BatchingStage, IterDataset):
    """Stacks each ``batch_size`` consecutive elements of an IterDataset.

    Raises:
      ValueError: ``batch_size <= 0``.
    """

    def __iter__(self) -> DatasetIterator:
        return _BatchDatasetIterator(self._parent.__iter__(), self._batch_size, self._drop_remainder, self._batcher)
