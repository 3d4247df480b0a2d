"""Batch stages: consecutive elements stacked leaf by leaf along a new first axis."""

from __future__ import annotations

import copy
import functools
import itertools
import math
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar

import numpy as np

from grainlike.core import tree
from grainlike.core.shared_memory_array import SharedMemoryArray
from grainlike.core.errors import add_note
from grainlike.core.protocols import TakesChunks
from grainlike.dataset.nodes.dataset_node import walk
from grainlike.dataset.nodes.element_spec import ShapeDtypeStruct, get_element_spec, map_specs
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import MapDataset, code_waits
from grainlike.dataset.transformations.chunk import ColumnFunction, user_functions
from grainlike.dataset.transformations.map import PassThroughStateIterator, note_iterator


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
    from grainlike.dataset.transformations.filter import FilterMapDataset
    from grainlike.dataset.transformations.flatmap import FlatMapMapDataset

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

    @property
    def stacks_rows(self) -> bool:
        """Whether the values are stacked into ``alloc``'s arrays (then row by row as they come, ``tree.Stacker``)."""
        fn = self.batch_fn
        return fn.stacks_values if isinstance(fn, ColumnFunction) else fn is None and not self.to_shared_memory

    def __call__(self, values: list, meta: Any = None, stacked: Any = None) -> Any:
        """The batch of ``values`` (of a chunk with ``meta``, and ``stacked`` if ``stacks_rows``)."""
        fn = self.batch_fn
        if isinstance(fn, ColumnFunction):
            return fn.batch_columns(values, meta, stacked, self.alloc)
        if stacked is not None:
            return stacked
        if meta is not None:
            values = meta.elements(values)
        if fn is not None:
            return fn(values)
        if self.to_shared_memory:
            return make_batch(values, output_to_shared_memory=True)
        return tree.stack(values, self.alloc)


class _BatchingStage:
    """What both batch stages share: their arguments and how their batches are stacked."""

    def _own_work_waits(self) -> bool:
        return any(code_waits(fn) for fn in self.user_transforms())

    @property
    def _element_spec(self) -> Any:
        input_spec = get_element_spec(self._parent)
        batch_fn = self._batcher.batch_fn
        if isinstance(batch_fn, functools.partial):
            batch_fn = batch_fn.func
        if batch_fn is not None:
            if callable(getattr(batch_fn, "output_spec", None)):  # the user's batch_fn
                return batch_fn.output_spec(input_spec, self._batch_size, self._drop_remainder)
            raise NotImplementedError("Element spec inference is not supported with custom batching functions")
        # A short last batch makes the batch dimension unknown.
        size = self._batch_size if self._drop_remainder else None
        return map_specs(lambda x: ShapeDtypeStruct(shape=(size,) + tuple(x.shape), dtype=x.dtype), input_spec)

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
        return () if self._batcher.batch_fn is None else user_functions(self._batcher.batch_fn)

    def set_allocator(self, alloc: Optional[tree.Allocator]) -> None:
        """Stacks leaves into arrays from ``alloc(shape, dtype)`` (None: numpy)."""
        self._batcher = copy.copy(self._batcher)  # (Not the other copies' of this stage: copy_stages.)
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
            from grainlike.dataset.transformations.filter import FilterMapDataset

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


# Elements of at least this many bytes are copied into their batch's rows as they
# come, on a chunk (tree.Stacker): while still in the CPU cache (W3's 256 KiB
# records: 8.3-8.6 GB/s against 8.0); smaller ones are stacked at the end, which
# costs less per element (W2's 37 KiB images: 1-1.5% faster so).
ROW_BYTES = 64 << 10
# Stands in a batch's values for one already copied into its row.
_COPIED = object()


class _BatchDatasetIterator(PassThroughStateIterator):
    def __init__(self, parent: DatasetIterator, batch_size: int, drop_remainder: bool, batcher: _Batcher):
        super().__init__(parent)
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._batcher = batcher
        # Over to_iter_dataset()'s reading (and maps and filters over it), a batch
        # takes its elements in chunks (chunk.py).
        self._take = parent.take if isinstance(parent, TakesChunks) else None
        self._rows = True  # Whether to try copying elements into rows as they come.

    def __next__(self):
        if self._take is not None:
            return self._next_of_chunks()
        parent = self._parent
        values = list(itertools.islice(parent, self._batch_size))
        if not values or (self._drop_remainder and len(values) < self._batch_size):
            raise StopIteration
        try:
            return self._batcher(values)
        except Exception as e:
            self._note(e)
            raise

    def _note(self, error: Exception) -> None:
        if not isinstance(self._batcher.batch_fn, ColumnFunction):  # (which notes its own)
            note_iterator(error, self, self._parent)

    def _next_of_chunks(self) -> Any:
        """The next batch, of chunks taken from the parent (the elements it still needs each time)."""
        size, take = self._batch_size, self._take
        stacker = None
        if self._rows and self._batcher.stacks_rows:
            stacker = tree.Stacker(size, self._batcher.alloc, ROW_BYTES)
        values: list = []
        metas: list = []
        try:
            while len(values) < size:
                chunk = take(size - len(values))
                added = len(values)
                values += chunk.values
                if chunk.meta is not None:
                    metas.append(chunk.meta)
                if stacker is not None and stacker.active:
                    stacker.add(values, added)
                    for i in range(added, stacker.count):
                        values[i] = _COPIED  # Let go of: the next elements can reuse its memory.
                    self._rows = not stacker.unsuitable  # (Elements of this kind: stacked at the end.)
                if chunk.error is not None:
                    raise chunk.error
        except StopIteration:
            if not values or (self._drop_remainder and len(values) < size):
                raise
        meta = None if not metas else metas[0] if len(metas) == 1 else metas[0].concat(metas[1:])
        try:
            stacked = None if stacker is None else stacker.result()
            if stacked is None and stacker is not None and stacker.count:
                values = [stacker.element(i) if v is _COPIED else v for i, v in enumerate(values)]
            return self._batcher(values, meta, stacked)
        except Exception as e:
            self._note(e)
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
