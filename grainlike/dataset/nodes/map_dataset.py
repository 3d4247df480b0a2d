"""``MapDataset``: the random-access dataset, and the methods that build its stages.

``len(ds)`` is one epoch; ``ds[i]`` is the element at ``i`` (indices past the end
wrap into later epochs), ``None`` for an element a filter removed. Every
transformation is a stage in its own module; the methods here only build them.
"""

from __future__ import annotations

import abc
import builtins
import functools
from typing import Any, Callable, Generic, Iterator, Optional, Sequence, TypeVar

from grainlike.dataset.nodes.dataset_node import _Dataset, apply_transformations  # noqa: F401  (its import path)
from grainlike.dataset.nodes.stage_registry import stage_class
from grainlike.sources.waiting import declared_waits

T = TypeVar("T")
S = TypeVar("S")


def code_waits(code: Any) -> bool:
    """Whether running ``code`` (a transform, a function, a stage) waits: as it declares, else True.

    Raises:
      TypeError: its ``waits`` is not a bool.
    """
    declared = declared_waits(code)
    return True if declared is None else declared


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


class MapDatasetMeta(abc.ABCMeta):
    """Metaclass of ``MapDataset``: its class-level factories."""

    def source(cls, source: Any) -> "MapDataset":
        """A dataset over a random-access source (``len`` and ``[i]``, or a sequence).

        A finite ``tf.data.Dataset`` is read once into a ``TfDataSource``.

        Example:
          >>> list(MapDataset.source([1, 2, 3]))
          [1, 2, 3]
        """
        from grainlike.sources.tf_data import TfDataSource, is_tf_dataset

        return stage_class("SourceMapDataset")(TfDataSource(source) if is_tf_dataset(source) else source)

    def range(cls, start: int, stop: Optional[int] = None, step: int = 1) -> "MapDataset[int]":
        """The integers of ``range(start, stop, step)``.

        Example:
          >>> list(MapDataset.range(1, 7, 2))
          [1, 3, 5]
        """
        return stage_class("RangeMapDataset")(start, stop, step)

    def mix(
        cls, datasets: Sequence["MapDataset"], weights: Optional[Sequence[float]] = None
    ) -> "MapDataset":
        """Interleaves ``datasets`` in proportion to ``weights`` (uniform by default).

        The length is such that no element of any input appears twice.

        Example:
          >>> list(MapDataset.mix([MapDataset.range(5), MapDataset.range(7, 10)]))
          [0, 7, 1, 8, 2, 9]
        """
        return stage_class("MixedMapDataset")(parents=datasets, proportions=weights)

    def select_from_datasets(
        cls, datasets: Sequence["MapDataset"], selection_map: DatasetSelectionMap
    ) -> "MapDataset":
        """Picks element ``i`` as ``datasets[d][j]`` where ``(d, j) = selection_map[i]``."""
        return stage_class("MixedMapDataset")(parents=datasets, selection_map=selection_map)

    def concatenate(cls, datasets: Sequence["MapDataset"]) -> "MapDataset":
        """All elements of ``datasets[0]``, then of ``datasets[1]``, ...

        Example:
          >>> list(MapDataset.concatenate([MapDataset.range(2), MapDataset.range(5, 7)]))
          [0, 1, 5, 6]
        """
        return stage_class("ConcatenateMapDataset")(parents=datasets)


class MapDataset(_Dataset, Generic[T], metaclass=MapDatasetMeta):
    """A dataset with random access; transformations return new datasets.

    ``None`` marks an absent element (one a filter removed); every stage passes it
    through without calling the user's function, and iteration skips it.
    """

    @abc.abstractmethod
    def __len__(self) -> int:
        """Returns the length of one epoch."""

    @abc.abstractmethod
    def __getitem__(self, index):
        """Returns the element at ``index`` (``None`` if absent), or a sliced dataset."""

    def _getitems(self, indices: Sequence[int]) -> Sequence[Optional[T]]:
        """Returns the elements at ``indices`` (``None`` where absent); stages move whole chunks."""
        return [self.__getitem__(i) for i in indices]

    def _iter_items(self, indices: Sequence[int]) -> Iterator[Optional[T]]:
        """The elements of ``_getitems(indices)``, each as soon as it is computed (the maps' override).

        A reader in another thread may take the first elements of a chunk while the
        rest are computed, as grain delivers an element whose successor never finishes.
        """
        return iter(self._getitems(indices))

    def _own_work_waits(self) -> bool:
        """Whether the work this stage does itself, not its parents', waits (remote reads, user code).

        ``to_iter_dataset()`` without ``ReadOptions`` reads in threads when some
        stage's does (``transformations.read_threads``). A stage of a type
        grainlike does not know waits unless it declares ``waits = False``
        (``grainlike.sources.DeclaresWaiting``); grainlike's stages override this.
        """
        return code_waits(self)

    def _flat_map(self, transform: Any) -> "MapDataset":
        """A flat map of this dataset (``apply`` of a flat-map transform)."""
        return stage_class("FlatMapMapDataset")(self, transform)

    @functools.cached_property
    def _stats(self) -> Any:
        """grain's statistics recorder of this stage, for stages written for grain (records nothing by default).

        See ``grainlike.dataset.stats``: ``with self._stats.record_self_time():``
        and ``self._stats.record_output_spec(x)`` run as in grain.
        """
        from grainlike.dataset.stats import stats_of

        return stats_of(self)

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
        return stage_class("BatchMapDataset")(self, batch_size, drop_remainder=drop_remainder, batch_fn=batch_fn)

    def filter(self, transform: Any) -> "MapDataset[T]":
        """Keeps the elements for which ``transform`` is true; ``ds[i]`` is None otherwise.

        Example:
          >>> ds = MapDataset.range(5).filter(lambda x: x % 2 == 0)
          >>> ds[1] is None, list(ds)
          (True, [0, 2, 4])
        """
        return stage_class("FilterMapDataset")(self, transform)

    def map(self, transform: Any) -> "MapDataset":
        """Applies ``transform`` (a ``MapTransform`` or a callable) to each element.

        Example:
          >>> list(MapDataset.range(3).map(lambda x: x + 10))
          [10, 11, 12]
        """
        return stage_class("MapMapDataset")(self, transform)

    def map_with_index(self, transform: Any) -> "MapDataset":
        """Applies ``transform(index, element)`` to each element.

        Example:
          >>> list(MapDataset.source(["a", "b"]).map_with_index(lambda i, x: x + str(i)))
          ['a0', 'b1']
        """
        return stage_class("MapWithIndexMapDataset")(self, transform)

    def seed(self, seed: int) -> "MapDataset[T]":
        """Seeds every downstream random stage that is given no seed of its own.

        Each such stage derives a distinct seed from ``seed`` and its position in
        the pipeline.

        Example:
          >>> sorted(MapDataset.range(4).seed(7).shuffle())
          [0, 1, 2, 3]
        """
        return stage_class("WithSeedMapDataset")(self, seed=seed)

    def shuffle(self, seed: Optional[int] = None) -> "MapDataset[T]":
        """A global shuffle, different (but deterministic) in each epoch.

        Args:
          seed: in ``[0, 2**32)``; defaults to the seed derived from ``seed()``.

        Example:
          >>> sorted(MapDataset.range(5).shuffle(seed=1))
          [0, 1, 2, 3, 4]
        """
        return stage_class("ShuffleMapDataset")(self, seed=seed)

    def slice(self, sl: "builtins.slice | Sequence[int]") -> "MapDataset[T]":
        """The elements at the indices of ``sl``; ``ds[i::n]`` is shard ``i`` of ``n``.

        Args:
          sl: a ``slice``, or a sequence of ints (a ``MapDataset[int]`` too) of
            indices into this dataset, which may repeat and come in any order (as
            grain's main branch; grain 0.2.18 takes a ``slice`` only).

        Example:
          >>> list(MapDataset.range(10).slice(slice(1, None, 4)))
          [1, 5, 9]
          >>> list(MapDataset.range(10).slice([3, 1, 4, 1]))
          [3, 1, 4, 1]
        """
        if isinstance(sl, builtins.slice):
            return stage_class("SliceMapDataset")(self, sl)
        if not (hasattr(type(sl), "__len__") and hasattr(type(sl), "__getitem__")):
            # Neither a slice nor indices: grain 0.2.18's error, at once (grain's main
            # branch builds it and fails at len()).
            raise ValueError(f"sl is not a slice: {type(sl)}")
        return stage_class("ReindexMapDataset")(self, sl)

    def random_map(self, transform: Any, *, seed: Optional[int] = None) -> "MapDataset":
        """Applies ``transform(element, rng)``, the rng keyed on the seed and the index.

        Example:
          >>> ds = MapDataset.range(3).random_map(lambda x, rng: x + rng.integers(10), seed=0)
          >>> list(ds) == list(ds)
          True
        """
        return stage_class("RandomMapMapDataset")(self, transform, seed=seed)

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
        return stage_class("RepeatMapDataset")(self, num_epochs, reseed_each_epoch=reseed_each_epoch)

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
        return stage_class("PrefetchIterDataset")(self, read_options=read_options, allow_nones=allow_nones)

    def __iter__(self) -> "DatasetIterator[T]":
        return self.to_iter_dataset().__iter__()
