"""Map, random map and map-with-index stages, for MapDataset and IterDataset.

User functions never see ``None`` (an element a filter removed): the stages pass it
through. An error raised by a user function keeps its type and gets a note naming
the transform and the element's index (MapDataset) or the pipeline's state after
reading the element (IterDataset).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from grainlike.core.errors import add_note
from grainlike.core.transforms import (
    MapTransform,
    MapWithIndexTransform,
    RandomMapTransform,
    get_pretty_transform_name,
    transform_name,
)
from grainlike.dataset.iter_dataset import IterDataset
from grainlike.dataset.iterator import DatasetIterator
from grainlike.dataset.map_dataset import MapDataset
from grainlike.dataset.rng_pool import RngPool
from grainlike.dataset.state import non_negative_int, require_keys


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


def described(stage: Any) -> str:
    """``stage`` as error notes name it: its user transform with file and line, where it has one.

    ``str()`` is grain's text, which names a transform class without its file.
    """
    describe = getattr(stage, "describe", None)
    return describe() if callable(describe) else str(stage)


def note_element(error: BaseException, stage: Any, where: str) -> None:
    """Notes which transform failed on which element."""
    add_note(error, f"grainlike: in {described(stage)} on the element at {where}")


def note_iterator(error: BaseException, stage: Any, parent: DatasetIterator) -> None:
    """Notes which transform failed, and where the pipeline stood after reading."""
    try:
        state = parent.get_state()
    except Exception:  # Never hide the original error.
        state = "unknown"
    add_note(error, f"grainlike: in {described(stage)}; the pipeline's state after reading the element: {state}")


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

    _accepts: Optional[type] = MapTransform
    _method = "map"

    def __init__(self, parent: Any, transform: Any):
        super().__init__(parent)
        self._transform = transform
        self._name = transform_name(transform)
        if self._accepts is not None:
            self._fn = user_function(transform, self._accepts, self._method, self._method)

    def _pretty_name(self) -> str:
        """The transform as grain's ``str()`` of this stage and its iterator names it."""
        return get_pretty_transform_name(self._transform)

    def __str__(self) -> str:
        return f"{type(self).__name__}(transform={self._pretty_name()})"

    def describe(self) -> str:
        return f"{type(self).__name__}(transform={self._name})"

    def user_transforms(self) -> tuple:
        return (self._transform,)


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
    """``fn(element)``; ``pretty`` names the transform in ``str()`` (grain's text), ``name`` in errors."""

    def __init__(self, parent: DatasetIterator, fn: Callable, name: str, pretty: Optional[str] = None):
        super().__init__(parent)
        self._fn = fn
        self._name = name
        self._pretty = name if pretty is None else pretty
        # Called once per element: the bound method, without next()'s lookups.
        self._pull = parent.__next__

    def __next__(self):
        element = self._pull()
        if element is None:
            return None
        try:
            return self._fn(element)
        except BaseException as e:  # (sys.exit() too: noted, then raised)
            note_iterator(e, self, self._parent)
            raise

    def _get_next_index(self) -> int:
        return self._parent._get_next_index()

    def _set_next_index(self, index: int) -> None:
        self._parent._set_next_index(index)

    def __str__(self) -> str:
        return f"MapDatasetIterator(transform={self._pretty})"

    def describe(self) -> str:
        return f"MapDatasetIterator(transform={self._name})"


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


class TransformIterDataset(UserTransformStage, IterDataset):
    """An IterDataset stage applying a user transform."""


class MapIterDataset(TransformIterDataset):
    """``fn(element)`` for each element of an IterDataset."""

    def __iter__(self) -> DatasetIterator:
        return _MapDatasetIterator(self._parent.__iter__(), self._fn, self._name, self._pretty_name())


class RandomMapIterDataset(_RandomStage, TransformIterDataset):
    """``fn(element, rng)`` for each element of an IterDataset."""

    def __iter__(self) -> DatasetIterator:
        return _RandomMapDatasetIterator(self._parent.__iter__(), self._fn, self._seed, self._name, self._pretty_name())


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
        return _CountingIterator(self._parent.__iter__(), self._fn, self._name, self._pretty_name())
