"""Map, random map and map-with-index stages, for MapDataset and IterDataset.

User functions never see ``None`` (an element a filter removed): the stages pass it
through. An error raised by a user function keeps its type and gets a note naming
the transform and the element's index (MapDataset) or the pipeline's state after
reading the element (IterDataset).
"""

from __future__ import annotations

import bisect
import functools
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from grainlike.core.errors import add_note
from grainlike.core.protocols import TakesChunks
from grainlike.core.transforms import (
    MapTransform,
    MapWithIndexTransform,
    RandomMapTransform,
    get_pretty_transform_name,
    transform_name,
)
from grainlike.dataset.nodes.element_spec import get_element_spec, transform_output_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator
from grainlike.dataset.nodes.map_dataset import MapDataset, code_waits
from grainlike.dataset.transformations.chunk import Chunk, ColumnFunction, user_functions
from grainlike.dataset.transformations.rng_pool import RngPool
from grainlike.dataset.nodes.state import non_negative_int, require_keys


def user_function(transform: Any, cls: type, method: str, stage: str) -> Callable:
    """``transform.<method>`` for a ``cls`` (or a non-callable with that method), else the callable ``transform``.

    Raises:
      TypeError: ``transform`` is neither a ``cls`` nor callable.
    """
    if isinstance(transform, cls) or (not callable(transform) and callable(getattr(transform, method, None))):
        return getattr(transform, method)
    if not callable(transform):
        raise TypeError(
            f"{stage} takes a {cls.__name__} or a callable, got {transform!r} "
            f"of type {type(transform).__name__}"
        )
    return transform


def note_element(error: BaseException, stage: Any, where: str) -> None:
    """Notes which transform failed on which element (``stage``: a dataset or its iterator)."""
    add_note(error, f"grainlike: in {stage.describe()} on the element at {where}")


def note_iterator(error: BaseException, stage: DatasetIterator, parent: DatasetIterator) -> None:
    """Notes which transform failed, and where the pipeline stood after reading."""
    try:
        state = parent.get_state()
    except Exception:  # Never hide the original error.
        state = "unknown"
    add_note(error, f"grainlike: in {stage.describe()}; the pipeline's state after reading the element: {state}")


def seeded_pool(seed: Any) -> RngPool:
    """grain's rng pool for ``seed``, which is checked now (``RngPool`` checks at its first draw)."""
    try:
        np.random.Philox(seed)
    except (TypeError, ValueError) as e:
        add_note(e, f"grainlike: random_map seed must be a non-negative int, got {seed!r}")
        raise
    return RngPool(seed)


class UserTransformStage:
    """A dataset stage applying one user transform, a ``_accepts`` (``None``: any) or a callable."""

    def _own_work_waits(self) -> bool:
        return any(code_waits(fn) for fn in self.user_transforms())

    _accepts: Optional[type] = MapTransform
    _method = "map"

    def __init__(self, parent: Any, transform: Any):
        super().__init__(parent)
        self._transform = transform
        if self._accepts is not None:
            self._fn = user_function(transform, self._accepts, self._method, self._method)

    @functools.cached_property
    def _name(self) -> str:
        """The user transform with its file and line, as errors name it (found when first asked: ~10 ms)."""
        return transform_name(next(iter(self.user_transforms()), self._transform))

    def _pretty_name(self) -> str:
        """The transform as grain's ``str()`` of this stage and its iterator names it."""
        return get_pretty_transform_name(self._transform)

    def __str__(self) -> str:
        return f"{type(self).__name__}(transform={self._pretty_name()})"

    def describe(self) -> str:
        return f"{type(self).__name__}(transform={self._name})"

    def user_transforms(self) -> tuple:
        return user_functions(self._transform)


class _RandomStage(UserTransformStage):
    """A random map: ``fn(element, rng)``, seeded by ``seed`` or by ``ds.seed()``."""

    _accepts = RandomMapTransform
    _method = "random_map"

    def __init__(self, parent: Any, transform: Any, seed: Optional[int] = None):
        super().__init__(parent, transform)
        self._seed = self._default_seed if seed is None else seed
        if self._seed is None:
            raise ValueError(
                "`random_map` requires a seed. Please either provide it with "
                "`ds.seed(seed)` before any random transformations or pass it "
                f"directly with `ds.random_map(transform, seed=seed)`. (transform: {self._name})"
            )


class ElementwiseMapDataset(UserTransformStage, MapDataset):
    """A MapDataset stage applying ``_apply(index, element)`` to each present element."""

    @property
    def _element_spec(self) -> Any:
        return transform_output_spec(self._transform, get_element_spec(self._parent))

    def _apply(self, index: int, element: Any) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        element = self._parent[index]
        if element is None:
            return None
        try:
            return self._apply(index, element)
        except BaseException as e:  # (sys.exit() too: noted, then raised)
            note_element(e, self, f"index {index}")
            raise

    def _iter_items(self, indices: Sequence[int]) -> Iterator[Any]:
        # The parent's chunk (one batched read at the source), then element by element.
        apply = self._apply
        for i, x in zip(indices, self._parent._iter_items(indices)):
            if x is not None:
                try:
                    x = apply(i, x)
                except BaseException as e:  # (sys.exit() too: noted, then raised)
                    note_element(e, self, f"index {i}")
                    raise
            yield x

    def _getitems(self, indices: Sequence[int]) -> list:
        elements = self._parent._getitems(indices)
        apply = self._apply
        out: list = []
        append = out.append
        try:
            for i, x in zip(indices, elements):
                append(None if x is None else apply(i, x))
        except BaseException as e:  # (sys.exit() too: noted, then raised)
            note_element(e, self, f"index {indices[len(out)]}")
            raise
        return out


class MapMapDataset(ElementwiseMapDataset):
    """``fn(element)`` for each element."""

    def _apply(self, index: int, element: Any) -> Any:
        return self._fn(element)


class RandomMapMapDataset(_RandomStage, ElementwiseMapDataset):
    """``fn(element, rng)``; the rng of index ``i`` is keyed on the seed, counted by ``i``."""

    def __init__(self, parent: MapDataset, transform: Any, seed: Optional[int] = None):
        super().__init__(parent, transform, seed)
        self._pool = seeded_pool(self._seed)

    def _apply(self, index: int, element: Any) -> Any:
        pool = self._pool
        rng = pool.acquire_rng(index)
        result = self._fn(element, rng)
        pool.release_rng(rng)
        return result


class MapWithIndexMapDataset(ElementwiseMapDataset):
    """``fn(index, element)`` for each element."""

    _accepts = MapWithIndexTransform
    _method = "map_with_index"

    def _apply(self, index: int, element: Any) -> Any:
        return self._fn(index, element)


class PassThroughStateIterator(DatasetIterator):
    """An iterator stage whose state is its parent's."""

    def get_state(self) -> dict:
        return self._parent.get_state()

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state)


class _MapDatasetIterator(PassThroughStateIterator):
    """``fn(element)``; the stage names the transform in ``str()`` (grain's text) and in errors."""

    def __init__(self, parent: DatasetIterator, stage: UserTransformStage):
        super().__init__(parent)
        self._stage = stage
        self._fn = stage._fn
        # A function of elements with metadata that works on columns notes its own errors.
        self._columns = stage._fn if isinstance(stage._fn, ColumnFunction) else None
        # Called once per element: the bound method, without next()'s lookups.
        self._pull = parent.__next__

    def __next__(self):
        element = self._pull()
        if element is None:
            return None
        try:
            return self._fn(element)
        except BaseException as e:  # (sys.exit() too: noted, then raised)
            if self._columns is None:
                note_iterator(e, self, self._parent)
            raise

    def _get_next_index(self) -> int:
        return self._parent._get_next_index()

    def _set_next_index(self, index: int) -> None:
        self._parent._set_next_index(index)

    def __str__(self) -> str:
        return f"MapDatasetIterator(transform={self._stage._pretty_name()})"

    def describe(self) -> str:
        return f"MapDatasetIterator(transform={self._stage._name})"


class _MapChunksIterator(_MapDatasetIterator):
    """A map over an iterator that hands over chunks: maps a chunk at a time for a batch above (``chunk.py``)."""

    def take(self, k: int) -> Chunk:
        chunk = self._parent.take(k)
        values, meta, out = chunk.values, chunk.meta, []
        if not values:  # (An error before any element.)
            return chunk
        try:
            if meta is None:
                fn, append = self._fn, out.append
                for v in values:
                    append(None if v is None else fn(v))
            elif self._columns is not None:
                self._columns.map_columns(values, meta, out)
            else:  # A function of whole elements: what it returns carries no metadata.
                fn, append = self._fn, out.append
                for v in chunk.elements():
                    append(fn(v))
                chunk.meta = None
        except BaseException as e:  # (sys.exit() too: noted, then raised at once)
            if meta is not None and self._columns is None:
                chunk.meta = None
            chunk.values = out
            chunk.fail(len(out), e)
            if self._columns is None:
                note_iterator(e, self, self._parent)
            if not isinstance(e, Exception):
                raise
            return chunk
        chunk.values = out
        return chunk


class _CountingIterator(DatasetIterator):
    """Applies ``_apply(count, element)`` to present elements; the state counts every element."""

    _counter_key = "counter"
    _label = "MapWithIndexDatasetIterator"

    def __init__(self, parent: DatasetIterator, fn: Callable, name: str, pretty: Optional[str] = None):
        super().__init__(parent)
        self._fn = fn
        self._name = name
        self._pretty = name if pretty is None else pretty
        self._count = 0

    def _apply(self, count: int, element: Any) -> Any:
        return self._fn(count, element)

    def _apply_all(self, start: int, values: list, out: list) -> None:
        """Appends ``_apply(start + i, values[i])`` (None for None) to ``out`` in turn; raises where one fails."""
        fn, append = self._fn, out.append
        for count, v in enumerate(values, start):
            append(None if v is None else fn(count, v))

    def __next__(self):
        element = next(self._parent)
        if element is not None:
            try:
                element = self._apply(self._count, element)
            except BaseException as e:  # (sys.exit() too: noted, then raised)
                note_iterator(e, self, self._parent)
                raise
        self._count += 1
        return element

    def get_state(self) -> dict:
        return {"parent": self._parent.get_state(), self._counter_key: self._count}

    def set_state(self, state: dict) -> None:
        require_keys(state, self, ("parent", self._counter_key))
        count = non_negative_int(state, self._counter_key, self)
        self._parent.set_state(state["parent"])
        self._count = count

    def _get_next_index(self) -> int:
        return self._count

    def _set_next_index(self, index: int) -> None:
        self._parent._set_next_index(index)
        self._count = index

    def __str__(self) -> str:
        return f"{self._label}(transform={self._pretty})"

    def describe(self) -> str:
        return f"{self._label}(transform={self._name})"


class _RandomMapDatasetIterator(_CountingIterator):
    """Element ``k`` of worker ``w`` of ``W`` gets the rng counted by ``w + k * W``."""

    _counter_key = "index_for_rng"
    _label = "RandomMapDatasetIterator"

    def __init__(self, parent: DatasetIterator, fn: Callable, seed: Any, name: str, pretty: Optional[str] = None):
        super().__init__(parent, fn, name, pretty)
        self._pool = seeded_pool(seed)

    def _apply(self, count: int, element: Any) -> Any:
        mp = self._ctx.mp_context
        rng = self._pool.acquire_rng(mp.process_index + count * mp.process_count)
        result = self._fn(element, rng)
        self._pool.release_rng(rng)
        return result

    def _apply_all(self, start: int, values: list, out: list) -> None:
        mp = self._ctx.mp_context
        worker, workers = mp.process_index, mp.process_count
        fn, append = self._fn, out.append
        acquire, release = self._pool.acquire_rng, self._pool.release_rng
        for count, v in enumerate(values, start):
            if v is None:
                append(None)
            else:
                rng = acquire(worker + count * workers)
                append(fn(v, rng))
                release(rng)


class _CountsChunks:
    """A counting stage over an iterator that hands over chunks: counts a chunk at a time (``chunk.py``).

    Its state is that of ``next()`` element by element at every point: the
    whole chunk is counted, and where a stage above fails at an element, the
    chunk recounts (``Chunk.on_fail``) the elements up to that one.
    """

    _count: int
    _parent: Any

    def take(self, k: int) -> Chunk:
        chunk = self._parent.take(k)
        values = chunk.values
        n = len(values)
        if not n:  # (An error before any element.)
            return chunk
        start, out = self._count, []
        # With metadata columns, the function gets whole elements: what it returns carries no metadata.
        whole = chunk.meta is not None
        try:
            self._apply_all(start, chunk.elements() if whole else values, out)
        except BaseException as e:  # (sys.exit() too: noted, then raised at once)
            if whole:
                chunk.meta = None
            chunk.values = out
            self._recount_on_fail(chunk, start, len(out))  # (Counts the elements before the failing one.)
            chunk.fail(len(out), e)
            note_iterator(e, self, self._parent)
            if not isinstance(e, Exception):
                raise
            return chunk
        if whole:
            chunk.meta = None
        chunk.values = out
        self._count = start + n
        self._recount_on_fail(chunk, start, n)
        return chunk

    def _recount_on_fail(self, chunk: Chunk, start: int, n: int) -> None:
        """Where a stage above fails, counts from ``start`` this chunk's first ``n`` elements up to the failing one."""
        first, positions = chunk.start, chunk.positions
        if positions is None:  # Consecutive from ``first``.

            def recount(position: int) -> None:
                self._count = start + min(n, max(0, position - first + 1))

        else:
            positions = positions[:n]  # (Before a filter above selects.)

            def recount(position: int) -> None:
                self._count = start + bisect.bisect_right(positions, position)

        chunk.on_fail.append(recount)


class _MapWithIndexChunksIterator(_CountsChunks, _CountingIterator):
    """``map_with_index`` over an iterator that hands over chunks."""


class _RandomMapChunksIterator(_CountsChunks, _RandomMapDatasetIterator):
    """``random_map`` over an iterator that hands over chunks."""


class TransformIterDataset(UserTransformStage, IterDataset):
    """An IterDataset stage applying a user transform."""

    @property
    def _element_spec(self) -> Any:
        return transform_output_spec(self._transform, get_element_spec(self._parent))


class MapIterDataset(TransformIterDataset):
    """``fn(element)`` for each element of an IterDataset."""

    def __iter__(self) -> DatasetIterator:
        parent = self._parent.__iter__()
        return (_MapChunksIterator if isinstance(parent, TakesChunks) else _MapDatasetIterator)(parent, self)


class RandomMapIterDataset(_RandomStage, TransformIterDataset):
    """``fn(element, rng)`` for each element of an IterDataset."""

    def __iter__(self) -> DatasetIterator:
        parent = self._parent.__iter__()
        cls = _RandomMapChunksIterator if isinstance(parent, TakesChunks) else _RandomMapDatasetIterator
        return cls(parent, self._fn, self._seed, self._name, self._pretty_name())


class MapWithIndexIterDataset(TransformIterDataset):
    """``fn(position, element)`` for each element of an IterDataset."""

    _accepts = MapWithIndexTransform
    _method = "map_with_index"

    def _pretty_name(self) -> str:
        # grain names the transform object here (its repr), not its bound method.
        if isinstance(self._transform, MapWithIndexTransform):
            return repr(self._transform)
        return super()._pretty_name()

    def __iter__(self) -> DatasetIterator:
        parent = self._parent.__iter__()
        cls = _MapWithIndexChunksIterator if isinstance(parent, TakesChunks) else _CountingIterator
        return cls(parent, self._fn, self._name, self._pretty_name())
