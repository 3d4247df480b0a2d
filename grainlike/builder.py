"""A chained way to write a DataLoader, for notebooks.

``grainlike.from_source(source).shuffle(seed).map(f).batch(128).build()`` builds the
same ``DataLoader`` as the explicit constructor with an ``IndexSampler`` over the
whole source: the same records in the same order and the same checkpoint JSON.
Each method returns a new builder (re-running a notebook cell never appends twice).
``map``, ``random_map``, ``filter`` and ``map_with_index`` take a transform object
or a plain function (lambdas included: worker processes receive them by value).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Union

import numpy as np

from grainlike.core import sharding
from grainlike.core.samplers import IndexSampler
from grainlike.core.transforms import (
    Batch,
    FilterTransform,
    MapTransform,
    MapWithIndexTransform,
    RandomMapTransform,
)
from grainlike.loader.data_loader import DataLoader
from grainlike.loader.options import ReadOptions

__all__ = ["LoaderBuilder", "from_source"]


class _FunctionMap(MapTransform):
    """A MapTransform calling a plain function; error notes name the function."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.__wrapped__ = fn

    def map(self, element: Any) -> Any:
        return self.__wrapped__(element)

    def __repr__(self) -> str:
        return f"map({getattr(self.__wrapped__, '__qualname__', self.__wrapped__)!s})"


class _FunctionRandomMap(RandomMapTransform):
    """A RandomMapTransform calling ``fn(element, rng)``."""

    def __init__(self, fn: Callable[[Any, np.random.Generator], Any]):
        self.__wrapped__ = fn

    def random_map(self, element: Any, rng: np.random.Generator) -> Any:
        return self.__wrapped__(element, rng)

    def __repr__(self) -> str:
        return f"random_map({getattr(self.__wrapped__, '__qualname__', self.__wrapped__)!s})"


class _FunctionFilter(FilterTransform):
    """A FilterTransform calling ``fn(element) -> bool``."""

    def __init__(self, fn: Callable[[Any], bool]):
        self.__wrapped__ = fn

    def filter(self, element: Any) -> bool:
        return self.__wrapped__(element)

    def __repr__(self) -> str:
        return f"filter({getattr(self.__wrapped__, '__qualname__', self.__wrapped__)!s})"


class _FunctionMapWithIndex(MapWithIndexTransform):
    """A MapWithIndexTransform calling ``fn(index, element)``."""

    def __init__(self, fn: Callable[[int, Any], Any]):
        self.__wrapped__ = fn

    def map_with_index(self, index: int, element: Any) -> Any:
        return self.__wrapped__(index, element)

    def __repr__(self) -> str:
        return f"map_with_index({getattr(self.__wrapped__, '__qualname__', self.__wrapped__)!s})"


def _as_transform(value: Any, kind: type, wrapper: type, method: str) -> Any:
    if isinstance(value, kind):
        return value
    if isinstance(value, type) and issubclass(value, kind):
        raise TypeError(f".{method}() got the class {value.__name__}; pass an instance: {value.__name__}()")
    if isinstance(value, (MapTransform, RandomMapTransform, FilterTransform, MapWithIndexTransform, Batch)):
        raise TypeError(
            f".{method}() got a {type(value).__name__}, which is not a {kind.__name__}; "
            f"use the builder method for that kind of transform"
        )
    if not callable(value):
        raise TypeError(f".{method}() takes a {kind.__name__} or a function, got {value!r}")
    return wrapper(value)


def _check_count(name: str, value: Any, low: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        none = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an int >= {low}{none}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class LoaderBuilder:
    """Collects a DataLoader's configuration one call at a time; ``build()`` makes it.

    Defaults: no shuffle, one epoch, no sharding, no workers, grain's buffer and
    read options. Use ``from_source(source)`` to start.

    Example:
      >>> loader = from_source(list(range(10))).map(lambda x: x * 2).batch(4).build()
      >>> [b.tolist() for b in loader]
      [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]
    """

    source: Any
    operations: tuple = ()
    shuffle_: bool = False
    seed_: Optional[int] = None
    num_epochs: Optional[int] = 1
    worker_count: int = 0
    worker_buffer_size: int = 1
    shard_options: sharding.ShardOptions = sharding.NoSharding()
    read_options: Optional[ReadOptions] = None
    sampler_: Any = None

    def _with(self, **changes: Any) -> "LoaderBuilder":
        return dataclasses.replace(self, **changes)

    def _op(self, op: Any) -> "LoaderBuilder":
        return self._with(operations=self.operations + (op,))

    # -- order -------------------------------------------------------------------

    def shuffle(self, seed: int) -> "LoaderBuilder":
        """Shuffles globally with a new permutation every epoch (grain's)."""
        return self._with(shuffle_=True, seed_=seed)

    def seed(self, seed: int) -> "LoaderBuilder":
        """Seeds the per-record rngs of random maps without shuffling."""
        return self._with(seed_=seed)

    def epochs(self, num_epochs: Optional[int]) -> "LoaderBuilder":
        """Number of passes over the data; None repeats forever. Default 1."""
        _check_count("epochs", num_epochs, 1, allow_none=True)
        return self._with(num_epochs=num_epochs)

    def shard(self, shard_options: sharding.ShardOptions) -> "LoaderBuilder":
        """Reads one shard, e.g. ``ShardByJaxProcess(drop_remainder=True)``."""
        if not isinstance(shard_options, sharding.ShardOptions):
            raise TypeError(f".shard() takes a ShardOptions, got {shard_options!r}")
        return self._with(shard_options=shard_options)

    def sampler(self, sampler: Any) -> "LoaderBuilder":
        """Uses ``sampler`` (e.g. ``RandomSampler``) instead of an IndexSampler.

        ``shuffle``, ``seed`` and ``epochs`` then do not apply.
        """
        return self._with(sampler_=sampler)

    # -- operations ----------------------------------------------------------------

    def map(self, fn: Union[MapTransform, Callable[[Any], Any]]) -> "LoaderBuilder":
        """Appends a MapTransform, or a function of one element."""
        return self._op(_as_transform(fn, MapTransform, _FunctionMap, "map"))

    def random_map(self, fn: Union[RandomMapTransform, Callable[[Any, Any], Any]]) -> "LoaderBuilder":
        """Appends a RandomMapTransform, or a function ``fn(element, rng)``."""
        return self._op(_as_transform(fn, RandomMapTransform, _FunctionRandomMap, "random_map"))

    def filter(self, fn: Union[FilterTransform, Callable[[Any], bool]]) -> "LoaderBuilder":
        """Appends a FilterTransform, or a predicate; keeps elements where it is True."""
        return self._op(_as_transform(fn, FilterTransform, _FunctionFilter, "filter"))

    def map_with_index(self, fn: Union[MapWithIndexTransform, Callable[[int, Any], Any]]) -> "LoaderBuilder":
        """Appends a MapWithIndexTransform, or a function ``fn(index, element)``."""
        return self._op(
            _as_transform(fn, MapWithIndexTransform, _FunctionMapWithIndex, "map_with_index")
        )

    def batch(self, batch_size: int, drop_remainder: bool = False, *,
              pad: bool = False, batch_fn: Optional[Callable] = None) -> "LoaderBuilder":
        """Appends ``Batch(batch_size, drop_remainder, batch_fn, pad)``."""
        return self._op(Batch(batch_size, drop_remainder, batch_fn, pad))

    # -- execution -----------------------------------------------------------------

    def workers(self, worker_count: int) -> "LoaderBuilder":
        """Worker processes; 0 (the default) runs in the calling process."""
        _check_count("workers", worker_count, 0)
        return self._with(worker_count=worker_count)

    def prefetch(self, worker_buffer_size: int) -> "LoaderBuilder":
        """Finished outputs each worker keeps ready (``worker_buffer_size``)."""
        _check_count("prefetch", worker_buffer_size, 1)
        return self._with(worker_buffer_size=worker_buffer_size)

    def read(self, read_options: ReadOptions) -> "LoaderBuilder":
        """Read-ahead threads and buffer (``ReadOptions``)."""
        return self._with(read_options=read_options)

    def build(self) -> DataLoader:
        """The DataLoader.

        Raises:
          ValueError: a random_map without a seed (call ``.seed(s)`` or
            ``.shuffle(s)``), or what DataLoader / IndexSampler raise.
        """
        sampler = self.sampler_
        if sampler is None:
            if self.seed_ is None and any(isinstance(op, RandomMapTransform) for op in self.operations):
                raise ValueError(
                    "a random_map needs a seed for its per-record rngs: call .seed(s) "
                    "or .shuffle(s) before .build()"
                )
            sampler = IndexSampler(
                num_records=len(self.source),
                shard_options=self.shard_options,
                shuffle=self.shuffle_,
                num_epochs=self.num_epochs,
                seed=self.seed_,
            )
        return DataLoader(
            data_source=self.source,
            sampler=sampler,
            operations=list(self.operations),
            worker_count=self.worker_count,
            worker_buffer_size=self.worker_buffer_size,
            shard_options=self.shard_options,
            read_options=self.read_options,
        )

    def __iter__(self):
        """Iterating the builder iterates ``build()``."""
        return iter(self.build())


def from_source(source: Any) -> LoaderBuilder:
    """Starts a LoaderBuilder over a random-access source (``len`` and ``[key]``).

    Example:
      loader = (grainlike.from_source(source).shuffle(0).map(decode)
                .random_map(augment).filter(keep).batch(128).epochs(2)
                .workers(2).prefetch(2).build())
    """
    return LoaderBuilder(source)
