"""The Dataset API's three classes and the stage protocol they share.

* ``MapDataset``: random access. ``len(ds)`` is one epoch; ``ds[i]`` is the element
  at ``i`` (any ``i >= 0``: indices past the end wrap into later epochs), ``None``
  for an element a filter removed; ``ds._getitems(indices)`` reads many at once,
  which is the path iteration takes.
* ``IterDataset``: iterable only; ``iter(ds)`` builds a ``DatasetIterator``.
* ``DatasetIterator``: the iterator stage. Its state is a small JSON-able dict of
  indices that each stage nests or forwards, so a restore is exact and cheap.

Every transformation is a stage in its own module (``map.py``, ``shuffle.py``, ...);
the methods here only build them. Names, arguments, outputs, random draws and state
dicts are those of grain 0.2.18's Dataset API.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import functools
import threading
from typing import Any, Callable, Generic, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar, Union

import numpy as np

from grainlike.core.errors import ClosedIteratorError

T = TypeVar("T")
S = TypeVar("S")


class _Dropping(threading.local):
    """Per thread: how many iterators nobody holds are being closed (``close_dropped``)."""

    depth = 0


_DROPPING = _Dropping()


def close_dropped(iterator: Any) -> None:
    """Closes ``iterator``, which nobody holds any more: what its ``__del__`` does.

    While it runs, ``closing_dropped()`` is true in this thread, for every stage
    the close reaches. Never raises (it runs from ``__del__``, also while the
    interpreter exits).
    """
    dropping = _DROPPING  # None once this module is torn down at exit.
    try:
        if dropping is not None:
            dropping.depth += 1
        try:
            iterator.close()
        finally:
            if dropping is not None:
                dropping.depth -= 1
    except Exception:  # A finalizer never raises.
        pass


def closing_dropped() -> bool:
    """Whether this thread is closing an iterator nobody holds (``close_dropped``).

    Nothing will read what such an iterator's workers are computing, so they
    are not waited for beyond a short grace.
    """
    return _DROPPING.depth > 0


class DatasetSelectionMap(abc.ABC):
    """Maps an index of a mixed dataset to (dataset index, index within it).

    Must be stateless, picklable and deterministic: workers call it concurrently.

    Example:
      >>> class Concat(DatasetSelectionMap):
      ...     def __len__(self):
      ...         return 5
      ...     def __getitem__(self, index):
      ...         return (0, index) if index < 2 else (1, index - 2)
      >>> Concat()[3]
      (1, 1)
    """

    @abc.abstractmethod
    def __len__(self) -> int:
        """Returns the length of the mixed dataset."""

    @abc.abstractmethod
    def __getitem__(self, index: int) -> tuple[int, int]:
        """Returns (constituent dataset index, index within that dataset)."""


@dataclasses.dataclass(frozen=True)
class MultiprocessingContext:
    """Which worker process runs an iterator (``process_index`` of ``process_count``).

    Random transforms on iterators offset their per-element counters by it, so
    workers draw distinct numbers.
    """

    process_index: int = 0
    process_count: int = 1


@dataclasses.dataclass
class IteratorContext:
    """Context shared by all iterator stages of one pipeline.

    Set before the first ``next()``; the stages read it while running.
    """

    mp_context: MultiprocessingContext = MultiprocessingContext()
    # grain's DatasetOptions, merged from every WithOptionsIterDataset.
    dataset_options: Any = None

    def __post_init__(self):
        if self.dataset_options is None:
            from grainlike.dataset.options import DatasetOptions

            self.dataset_options = DatasetOptions()

    def merge(self, other: "IteratorContext") -> None:
        self.dataset_options = self.dataset_options.merge(other.dataset_options)
        if self.mp_context != other.mp_context:
            raise ValueError(
                "Cannot merge contexts from different worker processes: "
                f"{self.mp_context} vs {other.mp_context}."
            )


class _Dataset:
    """A node of the pipeline tree; derives default seeds from ``seed()`` calls."""

    def __init__(self, parents: Sequence["_Dataset"]):
        super().__init__()
        # Set by ``seed()``: seeds the default seeds of downstream random stages.
        self._seed_rng_seed: Optional[int] = None
        self._parents = parents

    @functools.cached_property
    def _default_seed(self) -> Optional[int]:
        """The seed a random stage uses when none is given (grain's derivation).

        Breadth-first from this node, the nearest ``seed()`` on each path
        contributes ``(seed, depth)``; the pairs seed a ``SeedSequence`` whose
        first 32-bit word is the result.
        """
        aggregated: list = []
        to_visit = [(self, 0)]
        while to_visit:
            node, depth = to_visit.pop(0)
            node_seed = getattr(node, "_seed_rng_seed", None)
            if node_seed is not None:
                aggregated.extend((node_seed, depth))
            else:
                # User-defined datasets may skip ``super().__init__`` and lack parents.
                to_visit.extend((p, depth + 1) for p in getattr(node, "_parents", ()))
        if not aggregated:
            return None
        return np.random.SeedSequence(aggregated).generate_state(1, dtype=np.uint32)[0]

    @property
    def _element_spec(self) -> Any:
        """The spec of this stage's elements, derived from its parents' without reading any.

        grain's hook, read by ``get_element_spec``: a dataset class of your own
        overrides it to say its spec. A map derives it with its transform's
        ``output_spec``; a stage that cannot know it raises ``NotImplementedError``.
        """
        from grainlike.dataset.element_spec import inferred_element_spec

        return inferred_element_spec(self)

    def describe(self) -> str:
        """This stage as error messages name it (grainlike only).

        ``str()`` is grain's text; a stage applying a user transform describes
        it with the file and line the transform was defined at, e.g.
        ``MapMapDataset(transform=Plus (/path/train.py:12))``.
        """
        return str(self)

    def user_transforms(self) -> tuple:
        """The user's transforms and functions this stage applies, in order (grainlike only).

        Errors about the pipeline name them with ``transform_name`` (class or
        function and where it was defined); a stage applying none returns ().
        """
        return ()

    def pipe(self, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Returns ``func(self, *args, **kwargs)``, to chain custom stages.

        Example:
          >>> MapDataset.range(4).pipe(lambda ds, n: ds.slice(slice(n)), 2)[1]
          1
        """
        return func(self, *args, **kwargs)


class MapDatasetMeta(abc.ABCMeta):
    """Metaclass of ``MapDataset``: its class-level factories."""

    def source(cls, source: Any) -> "MapDataset":
        """A dataset over a random-access source (``len`` and ``[i]``, or a sequence).

        Example:
          >>> list(MapDataset.source([1, 2, 3]))
          [1, 2, 3]
        """
        from grainlike.dataset.source import SourceMapDataset

        return SourceMapDataset(source)

    def range(cls, start: int, stop: Optional[int] = None, step: int = 1) -> "MapDataset[int]":
        """The integers of ``range(start, stop, step)``.

        Example:
          >>> list(MapDataset.range(1, 7, 2))
          [1, 3, 5]
        """
        from grainlike.dataset.source import RangeMapDataset

        return RangeMapDataset(start, stop, step)

    def mix(
        cls, datasets: Sequence["MapDataset"], weights: Optional[Sequence[float]] = None
    ) -> "MapDataset":
        """Interleaves ``datasets`` in proportion to ``weights`` (uniform by default).

        The length is such that no element of any input appears twice.

        Example:
          >>> list(MapDataset.mix([MapDataset.range(5), MapDataset.range(7, 10)]))
          [0, 7, 1, 8, 2, 9]
        """
        from grainlike.dataset.mix import MixedMapDataset

        return MixedMapDataset(parents=datasets, proportions=weights)

    def select_from_datasets(
        cls, datasets: Sequence["MapDataset"], selection_map: DatasetSelectionMap
    ) -> "MapDataset":
        """Picks element ``i`` as ``datasets[d][j]`` where ``(d, j) = selection_map[i]``."""
        from grainlike.dataset.mix import MixedMapDataset

        return MixedMapDataset(parents=datasets, selection_map=selection_map)

    def concatenate(cls, datasets: Sequence["MapDataset"]) -> "MapDataset":
        """All elements of ``datasets[0]``, then of ``datasets[1]``, ...

        Example:
          >>> list(MapDataset.concatenate([MapDataset.range(2), MapDataset.range(5, 7)]))
          [0, 1, 5, 6]
        """
        from grainlike.dataset.mix import ConcatenateMapDataset

        return ConcatenateMapDataset(parents=datasets)


class MapDataset(_Dataset, Generic[T], metaclass=MapDatasetMeta):
    """A dataset with random access; transformations return new datasets.

    ``None`` marks an absent element (one a filter removed); every stage passes it
    through without calling the user's function, and iteration skips it.
    """

    def __init__(self, parents: Union["MapDataset", Sequence["MapDataset"]] = ()):
        if isinstance(parents, MapDataset):
            parents = (parents,)
        else:
            parents = tuple(parents)
        super().__init__(parents)

    @property
    def parents(self) -> Sequence["MapDataset"]:
        return self._parents

    @property
    def _parent(self) -> "MapDataset":
        assert len(self._parents) == 1, self._parents
        return self._parents[0]

    @abc.abstractmethod
    def __len__(self) -> int:
        """Returns the length of one epoch."""

    @abc.abstractmethod
    def __getitem__(self, index):
        """Returns the element at ``index`` (``None`` if absent), or a sliced dataset."""

    def _getitems(self, indices: Sequence[int]) -> Sequence[Optional[T]]:
        """Returns the elements at ``indices`` (``None`` where absent), in order.

        Stages override it to move whole chunks at once; this default reads one
        index at a time.
        """
        return [self.__getitem__(i) for i in indices]

    def _iter_items(self, indices: Sequence[int]) -> Iterator[Optional[T]]:
        """The elements of ``_getitems(indices)``, each as soon as it is computed.

        A reader in another thread may take the first elements of a chunk while
        the rest are computed (as grain, which computes one element at a time,
        delivers an element whose successor never finishes). This default
        computes the whole chunk first; stages that compute element by element
        (the maps) override it.
        """
        return iter(self._getitems(indices))

    def apply(self, transformations: Any) -> "MapDataset":
        """Applies one transform or a sequence of them, dispatching on their type.

        Example:
          >>> from grainlike.core.transforms import Batch
          >>> MapDataset.range(5).apply([Batch(2)])[2].tolist()
          [4]
        """
        return apply_transformations(self, transformations)

    def batch(
        self,
        batch_size: int,
        *,
        drop_remainder: bool = False,
        batch_fn: Optional[Callable[[Sequence[T]], S]] = None,
    ) -> "MapDataset[S]":
        """Groups consecutive elements of each epoch, stacked along a new first axis.

        Example:
          >>> [b.tolist() for b in MapDataset.range(5).batch(2)]
          [[0, 1], [2, 3], [4]]
        """
        from grainlike.dataset.batch import BatchMapDataset

        return BatchMapDataset(self, batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)

    def filter(self, transform: Any) -> "MapDataset[T]":
        """Keeps the elements for which ``transform`` is true; ``ds[i]`` is None otherwise.

        Example:
          >>> ds = MapDataset.range(5).filter(lambda x: x % 2 == 0)
          >>> ds[1] is None, list(ds)
          (True, [0, 2, 4])
        """
        from grainlike.dataset.filter import FilterMapDataset

        return FilterMapDataset(self, transform)

    def map(self, transform: Any) -> "MapDataset":
        """Applies ``transform`` (a ``MapTransform`` or a callable) to each element.

        Example:
          >>> list(MapDataset.range(3).map(lambda x: x + 10))
          [10, 11, 12]
        """
        from grainlike.dataset.map import MapMapDataset

        return MapMapDataset(self, transform)

    def map_with_index(self, transform: Any) -> "MapDataset":
        """Applies ``transform(index, element)`` to each element.

        Example:
          >>> list(MapDataset.source(["a", "b"]).map_with_index(lambda i, x: x + str(i)))
          ['a0', 'b1']
        """
        from grainlike.dataset.map import MapWithIndexMapDataset

        return MapWithIndexMapDataset(self, transform)

    def seed(self, seed: int) -> "MapDataset[T]":
        """Seeds every downstream random stage that is given no seed of its own.

        Each such stage derives a distinct seed from ``seed`` and its position in
        the pipeline.

        Example:
          >>> sorted(MapDataset.range(4).seed(7).shuffle())
          [0, 1, 2, 3]
        """
        from grainlike.dataset.seed import WithSeedMapDataset

        return WithSeedMapDataset(self, seed=seed)

    def shuffle(self, seed: Optional[int] = None) -> "MapDataset[T]":
        """A global shuffle, different (but deterministic) in each epoch.

        Args:
          seed: in ``[0, 2**32)``; defaults to the seed derived from ``seed()``.

        Example:
          >>> sorted(MapDataset.range(5).shuffle(seed=1))
          [0, 1, 2, 3, 4]
        """
        from grainlike.dataset.shuffle import ShuffleMapDataset

        return ShuffleMapDataset(self, seed=seed)

    def slice(self, sl: builtins.slice) -> "MapDataset[T]":
        """The elements at the indices of ``sl``; ``ds[i::n]`` is shard ``i`` of ``n``.

        Example:
          >>> list(MapDataset.range(10).slice(slice(1, None, 4)))
          [1, 5, 9]
        """
        from grainlike.dataset.slice import SliceMapDataset

        return SliceMapDataset(self, sl)

    def random_map(self, transform: Any, *, seed: Optional[int] = None) -> "MapDataset":
        """Applies ``transform(element, rng)``, the rng keyed on the seed and the index.

        Example:
          >>> ds = MapDataset.range(3).random_map(lambda x, rng: x + rng.integers(10), seed=0)
          >>> list(ds) == list(ds)
          True
        """
        from grainlike.dataset.map import RandomMapMapDataset

        return RandomMapMapDataset(self, transform, seed=seed)

    def repeat(
        self, num_epochs: Optional[int] = None, *, reseed_each_epoch: bool = True
    ) -> "MapDataset[T]":
        """Repeats the dataset ``num_epochs`` times (forever for None).

        With ``reseed_each_epoch`` upstream shuffles and random maps differ in each
        epoch; without it every epoch repeats the first.

        Example:
          >>> list(MapDataset.range(2).repeat(2))
          [0, 1, 0, 1]
        """
        from grainlike.dataset.repeat import RepeatMapDataset

        return RepeatMapDataset(self, num_epochs, reseed_each_epoch=reseed_each_epoch)

    def to_iter_dataset(self, read_options: Any = None, *, allow_nones: bool = False) -> "IterDataset[T]":
        """Iterates over this dataset in order, reading chunks of elements at once.

        Args:
          read_options: a ``ReadOptions``; with ``num_threads > 0`` and
            ``prefetch_buffer_size > 0`` chunks are read ahead in that many
            threads. Without it, sources already in memory are read in the
            calling thread and other sources get grain's defaults.
          allow_nones: also yield the ``None`` of filtered-out elements.

        Example:
          >>> list(MapDataset.range(3).to_iter_dataset())
          [0, 1, 2]
        """
        from grainlike.dataset.prefetch import PrefetchIterDataset

        return PrefetchIterDataset(self, read_options=read_options, allow_nones=allow_nones)

    def __iter__(self) -> "DatasetIterator[T]":
        return self.to_iter_dataset().__iter__()


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
        from grainlike.dataset.mix import MixedIterDataset

        return MixedIterDataset(parents=datasets, proportions=weights)


class IterDataset(_Dataset, Iterable[T], metaclass=IterDatasetMeta):
    """A dataset that can only be iterated; transformations return new datasets."""

    def __init__(
        self, parents: Union[MapDataset, "IterDataset", Sequence[Union[MapDataset, "IterDataset"]]] = ()
    ):
        if isinstance(parents, (MapDataset, IterDataset)):
            parents = (parents,)
        else:
            parents = tuple(parents)
        super().__init__(parents)

    @property
    def parents(self) -> Sequence[Union[MapDataset, "IterDataset"]]:
        return self._parents

    @property
    def _parent(self) -> Union[MapDataset, "IterDataset"]:
        assert len(self._parents) == 1, self._parents
        return self._parents[0]

    def apply(self, transformations: Any) -> "IterDataset":
        """Applies one transform or a sequence of them, dispatching on their type."""
        return apply_transformations(self, transformations)

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
        from grainlike.dataset.batch import BatchIterDataset

        return BatchIterDataset(self, batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)

    def seed(self, seed: int) -> "IterDataset[T]":
        """Seeds every downstream random stage that is given no seed of its own."""
        from grainlike.dataset.seed import WithSeedIterDataset

        return WithSeedIterDataset(self, seed=seed)

    def filter(self, transform: Any) -> "IterDataset[T]":
        """Keeps the elements for which ``transform`` is true.

        Example:
          >>> list(MapDataset.range(5).to_iter_dataset().filter(lambda x: x > 2))
          [3, 4]
        """
        from grainlike.dataset.filter import FilterIterDataset

        return FilterIterDataset(self, transform)

    def map(self, transform: Any) -> "IterDataset":
        """Applies ``transform`` (a ``MapTransform`` or a callable) to each element."""
        from grainlike.dataset.map import MapIterDataset

        return MapIterDataset(self, transform)

    def random_map(self, transform: Any, *, seed: Optional[int] = None) -> "IterDataset":
        """Applies ``transform(element, rng)``, the rng keyed on the seed and a counter."""
        from grainlike.dataset.map import RandomMapIterDataset

        return RandomMapIterDataset(self, transform, seed=seed)

    def map_with_index(self, transform: Any) -> "IterDataset":
        """Applies ``transform(position, element)``, counting positions from 0."""
        from grainlike.dataset.map import MapWithIndexIterDataset

        return MapWithIndexIterDataset(self, transform)

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
            reads a contiguous range of each source (``MapDataset.source``,
            ``MapDataset.range``: grain's even split) instead of the elements
            ``w, w + W, ...`` of ``to_iter_dataset()``; a shuffle above a source
            then shuffles within each worker's range, and a state restores only
            on the same number of workers. See ``grainlike.dataset.worker_slice``.

        Warns:
          WorkersDropRemaindersWarning: a ``batch(..., drop_remainder=True)``
            below makes the workers, each batching its own slice, deliver fewer
            elements than the pipeline without workers (known from the lengths;
            the output is grain's either way). Batch after ``mp_prefetch`` instead.
        """
        from grainlike.dataset.options import MultiprocessingOptions

        options = options or MultiprocessingOptions(num_workers=10)
        if options.num_workers == 0:
            return self
        from grainlike.dataset.mp_prefetch import MultiprocessPrefetchIterDataset
        from grainlike.dataset.worker_remainders import warn_if_workers_drop_more

        ds = MultiprocessPrefetchIterDataset(
            self, options=options, worker_init_fn=worker_init_fn, sequential_slice=sequential_slice
        )
        warn_if_workers_drop_more(self, options.num_workers, sequential_slice)
        return ds

    @abc.abstractmethod
    def __iter__(self) -> "DatasetIterator[T]":
        """Returns a new iterator over this dataset."""


class DatasetIterator(Iterator[T], abc.ABC):
    """The iterator stage: ``__next__``, ``get_state``, ``set_state``, ``close``.

    Not thread-safe: one thread uses an iterator at a time.
    """

    def __init__(self, parents: Union["DatasetIterator", Sequence["DatasetIterator"]] = ()):
        super().__init__()
        if isinstance(parents, DatasetIterator):
            self._parents = (parents,)
        else:
            self._parents = tuple(parents)
        if self._parents:
            ctx = self._parents[0]._ctx
            # One context for the whole tree: merge the others' into the first
            # and point every iterator below at it.
            others = list(self._parents[1:])
            for parent in others:
                ctx.merge(parent._ctx)
            while others:
                node = others.pop()
                node._ctx = ctx
                others.extend(getattr(node, "_parents", ()))
            self._ctx: IteratorContext = ctx
        else:
            self._ctx = IteratorContext()
        if len(self._parents) == 1:
            # An attribute, not a property: stages read it once per element.
            self._parent: DatasetIterator = self._parents[0]
        self._closed = False

    def __iter__(self) -> "DatasetIterator[T]":
        return self

    @abc.abstractmethod
    def get_state(self) -> dict:
        """Returns the iterator's position: a JSON-able dict of indices."""

    @abc.abstractmethod
    def set_state(self, state: dict) -> None:
        """Moves the iterator to ``state`` (from ``get_state``)."""

    async def save(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable``: the state is read now, written later."""
        from grainlike.core import state_files  # Only when Orbax calls it.

        return await state_files.save_state_async(self, directory)

    async def load(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable``: restores from ``directory``."""
        from grainlike.core import state_files

        return await state_files.load_state_async(self, directory)

    def start_prefetch(self) -> None:
        """Starts reading ahead in the first asynchronous stage (idempotent)."""
        for parent in self._parents:
            parent.start_prefetch()

    def close(self) -> None:
        """Releases threads and processes of this stage and its parents (idempotent).

        Advancing a closed iterator raises ``ClosedIteratorError`` (a ``ValueError``).
        """
        if getattr(self, "_closed", True):
            return
        self._closed = True
        for parent in self._parents:
            parent.close()

    def _assert_not_closed(self) -> None:
        if self._closed:
            raise ClosedIteratorError(f"Trying to advance a closed iterator: '{self}'.")

    def _get_next_index(self) -> int:
        """The index of the element the next ``next()`` returns."""
        raise NotImplementedError(f"{self} cannot report its next index")

    def _set_next_index(self, index: int) -> None:
        """Moves to the element at ``index`` without computing any element."""
        raise NotImplementedError(f"{self} cannot move to an index without reading")

    def __del__(self):
        closer = close_dropped  # None while the interpreter tears the module down at exit
        if closer is not None:
            closer(self)


def apply_transformations(ds: Any, transformations: Any) -> Any:
    """Applies one transform or a sequence of them to a MapDataset or IterDataset.

    Accepts grainlike's ``Batch``, ``MapTransform``, ``RandomMapTransform``,
    ``MapWithIndexTransform`` and ``FilterTransform``, and flat maps (objects with
    ``flat_map`` and ``max_fan_out``).

    Raises:
      NotImplementedError: a transform of another type (as grain).
    """
    from grainlike.core.transforms import (
        Batch,
        FilterTransform,
        MapTransform,
        MapWithIndexTransform,
        RandomMapTransform,
    )

    if not isinstance(transformations, Sequence):
        transformations = (transformations,)
    for t in transformations:
        if isinstance(t, Batch):
            if t.pad:
                raise NotImplementedError(
                    f"Batch(pad=True) works in the DataLoader only; for a dataset use "
                    f"ds.batch({t.batch_size}, batch_fn=...) to pad ({t})"
                )
            ds = ds.batch(t.batch_size, drop_remainder=t.drop_remainder, batch_fn=t.batch_fn)
        elif isinstance(t, MapTransform):
            ds = ds.map(t)
        elif isinstance(t, RandomMapTransform):
            ds = ds.random_map(t)
        elif isinstance(t, MapWithIndexTransform):
            ds = ds.map_with_index(t)
        elif not isinstance(t, FilterTransform) and callable(getattr(t, "flat_map", None)):
            # grain's FlatMap: an object with flat_map() (and max_fan_out).
            from grainlike.dataset import flatmap

            stage = flatmap.FlatMapMapDataset if isinstance(ds, MapDataset) else flatmap.FlatMapIterDataset
            ds = stage(ds, t)
        elif isinstance(t, FilterTransform):
            ds = ds.filter(t)
        else:
            raise NotImplementedError(f"Transformation type: {t} is not supported.")
    return ds


def get_next_index(ds_iter: DatasetIterator) -> int:
    """The index of the element ``ds_iter`` returns next (grain's experimental API)."""
    return ds_iter._get_next_index()


def set_next_index(ds_iter: DatasetIterator, index: int) -> None:
    """Moves ``ds_iter`` to the element at ``index`` without reading any element."""
    ds_iter._set_next_index(index)
