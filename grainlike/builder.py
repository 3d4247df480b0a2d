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
import itertools
import sys
from typing import Any, Callable, Optional, Sequence, Union

from grainlike.core import sharding
from grainlike.core.errors import check_int
from grainlike.core.read_ahead import ReadAhead
from grainlike.core.samplers import IndexSampler, as_sampler
from grainlike.core.transforms import (
    Batch,
    FilterTransform,
    MapTransform,
    MapWithIndexTransform,
    RandomMapTransform,
    batch_elements,
)
from grainlike.loader.data_loader import DataLoader
from grainlike.dataset.nodes.options import ReadOptions
from grainlike.sources.tf_data import TfDataSource, is_tf_dataset

__all__ = ["BuiltLoader", "LoaderBuilder", "from_source"]


class _Function:
    """A transform calling a plain function; error notes and repr name the function."""

    _method: str

    def __init__(self, fn: Callable[..., Any]):
        self.__wrapped__ = fn

    def _call(self, *args: Any) -> Any:
        return self.__wrapped__(*args)

    def __repr__(self) -> str:
        return f"{self._method}({getattr(self.__wrapped__, '__qualname__', self.__wrapped__)!s})"


class _FunctionMap(_Function, MapTransform):
    _method, map = "map", _Function._call


class _FunctionRandomMap(_Function, RandomMapTransform):
    _method, random_map = "random_map", _Function._call


class _FunctionFilter(_Function, FilterTransform):
    _method, filter = "filter", _Function._call


class _FunctionMapWithIndex(_Function, MapWithIndexTransform):
    _method, map_with_index = "map_with_index", _Function._call


def _as_transform(value: Any, kind: type, wrapper: type) -> Any:
    method = wrapper._method
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


def _check_one_last_batch(operations: list, message: str) -> None:
    if not operations or not isinstance(operations[-1], Batch) or sum(isinstance(op, Batch) for op in operations) != 1:
        raise ValueError(f"{message}; got operations {operations!r:.300}")


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
    prefetch_: Optional[int] = None
    global_order: bool = False
    mesh: Any = None
    data_axis: Union[str, tuple] = "data"

    def _with(self, **changes: Any) -> "LoaderBuilder":
        return dataclasses.replace(self, **changes)

    def _op(self, op: Any) -> "LoaderBuilder":
        return self._with(operations=self.operations + (op,))

    def shuffle(self, seed: int) -> "LoaderBuilder":
        """Shuffles globally with a new permutation every epoch (grain's)."""
        return self._with(shuffle_=True, seed_=seed)

    def seed(self, seed: int) -> "LoaderBuilder":
        """Seeds the per-record rngs of random maps without shuffling."""
        return self._with(seed_=seed)

    def epochs(self, num_epochs: Optional[int]) -> "LoaderBuilder":
        """Number of passes over the data; None repeats forever. Default 1."""
        return self._with(num_epochs=check_int("epochs", num_epochs, 1, none_ok=True))

    def shard(self, shard_options: Any, data_axis: Union[str, Sequence[str], None] = None, *,
              data_axis_name: Union[str, Sequence[str], None] = None) -> "LoaderBuilder":
        """Reads one shard of the records, or each JAX process's slice of every global batch.

        ``.shard(ShardByJaxProcess(drop_remainder=True))`` (a ``ShardOptions``)
        reads one shard of the records, as ``IndexSampler(shard_options=...)``.

        ``.shard(mesh, data_axis="data")`` (a ``jax.sharding.Mesh``) makes the
        loader yield global ``jax.Array`` batches sharded over the mesh along
        ``data_axis`` (``NamedSharding(mesh, PartitionSpec(data_axis))``). The
        ``.batch(B)`` size is the global batch size: global batch ``k`` holds
        the records ``[k * B, (k + 1) * B)`` of the order a loader without
        sharding reads (shuffle, epochs and seed apply as there), and each JAX
        process reads and transforms only the rows its devices hold, with or
        without workers, in the same order. Needs one ``Batch``, as the last
        operation, no filter, and ``B`` a multiple of the data axis's size.

        Args:
          shard_options: a ``ShardOptions``, or a ``jax.sharding.Mesh``.
          data_axis: with a mesh, the axis name (or names) the batch is split
            over; default ``"data"``.
          data_axis_name: Loadax's name for ``data_axis``.

        Raises:
          TypeError: neither a ShardOptions nor a Mesh, a data axis with a
            ShardOptions, or ``data_axis`` and ``data_axis_name`` that differ.
          ValueError: a data axis the mesh does not have.
        """
        if data_axis is not None and data_axis_name is not None and data_axis != data_axis_name:
            raise TypeError(
                f".shard() got data_axis={data_axis!r} and data_axis_name={data_axis_name!r}; "
                "data_axis_name is Loadax's name for data_axis: pass one"
            )
        axis = data_axis if data_axis is not None else data_axis_name
        if isinstance(shard_options, sharding.ShardOptions):
            if axis is not None:
                raise TypeError(
                    f".shard() got a data axis ({axis!r}) with a ShardOptions; a data axis "
                    "goes with a jax.sharding.Mesh"
                )
            return self._with(shard_options=shard_options, mesh=None)
        jax = sys.modules.get("jax")  # A Mesh exists only once jax is imported.
        if jax is None or not isinstance(shard_options, jax.sharding.Mesh):
            raise TypeError(
                f".shard() takes a ShardOptions or a jax.sharding.Mesh, got {shard_options!r}"
            )
        from grainlike.jax.device_iterator import data_axes

        axes = data_axes(shard_options, "data" if axis is None else axis)
        return self._with(shard_options=sharding.NoSharding(), mesh=shard_options,
                          data_axis=axes[0] if len(axes) == 1 else axes)

    def sampler(self, sampler: Any) -> "LoaderBuilder":
        """Uses ``sampler`` (e.g. ``RandomSampler``) instead of an IndexSampler.

        ``shuffle``, ``seed`` and ``epochs`` then do not apply.
        """
        return self._with(sampler_=sampler)

    def map(self, fn: Union[MapTransform, Callable[[Any], Any]]) -> "LoaderBuilder":
        """Appends a MapTransform, or a function of one element."""
        return self._op(_as_transform(fn, MapTransform, _FunctionMap))

    def random_map(self, fn: Union[RandomMapTransform, Callable[[Any, Any], Any]]) -> "LoaderBuilder":
        """Appends a RandomMapTransform, or a function ``fn(element, rng)``."""
        return self._op(_as_transform(fn, RandomMapTransform, _FunctionRandomMap))

    def filter(self, fn: Union[FilterTransform, Callable[[Any], bool]]) -> "LoaderBuilder":
        """Appends a FilterTransform, or a predicate; keeps elements where it is True."""
        return self._op(_as_transform(fn, FilterTransform, _FunctionFilter))

    def map_with_index(self, fn: Union[MapWithIndexTransform, Callable[[int, Any], Any]]) -> "LoaderBuilder":
        """Appends a MapWithIndexTransform, or a function ``fn(index, element)``."""
        return self._op(_as_transform(fn, MapWithIndexTransform, _FunctionMapWithIndex))

    def batch(self, batch_size: int, drop_remainder: bool = False, *,
              pad: bool = False, batch_fn: Optional[Callable] = None,
              global_order: bool = False) -> "LoaderBuilder":
        """Appends ``Batch(batch_size, drop_remainder, batch_fn, pad)``.

        Args:
          global_order: with workers, batch after them, in the records' global
            order, so that batches do not depend on the worker count (records then
            travel from the workers one by one and are stacked in the calling
            process). False (default): each worker batches its own records, as
            grain's DataLoader does. Needs the Batch to be the last operation.
        """
        if not isinstance(global_order, bool):
            raise TypeError(f"global_order must be a bool, got {global_order!r}")
        return self._op(Batch(batch_size, drop_remainder, batch_fn, pad))._with(
            global_order=self.global_order or global_order
        )

    def workers(self, worker_count: int) -> "LoaderBuilder":
        """Worker processes; 0 (the default) runs in the calling process."""
        return self._with(worker_count=check_int("workers", worker_count))

    def prefetch(self, num_batches: int) -> "LoaderBuilder":
        """Reads ``num_batches`` outputs ahead of the consumer, with or without workers.

        Without workers a background thread reads ahead; with ``W`` workers each
        keeps ``ceil(num_batches / W)`` finished outputs ready
        (``worker_buffer_size``). Default: no read-ahead thread, one output per worker.
        """
        return self._with(prefetch_=check_int("prefetch", num_batches, 1))

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
        operations = list(self.operations)
        if self.mesh is not None:
            return self._build_on_mesh(sampler, operations)
        batch = None
        if self.global_order and self.worker_count > 0:
            _check_one_last_batch(operations, "batch(..., global_order=True) needs one Batch, as the last operation")
            if as_sampler(sampler).batch_padding is not None:  # as the DataLoader sees it
                raise ValueError(
                    f"batch(..., global_order=True) cannot mask the padding of {sampler!r}; "
                    "use per-worker batches with it"
                )
            batch = operations.pop()
        read_ahead = self.prefetch_ if self.worker_count == 0 else None
        args = self._loader_args(sampler, operations)
        if batch is None and read_ahead is None:
            return DataLoader(**args)
        return BuiltLoader(batch=batch, read_ahead=read_ahead, **args)

    def _build_on_mesh(self, sampler: Any, operations: list) -> "BuiltLoader":
        """The loader of ``.shard(mesh)``: this process's rows of each global batch, assembled."""
        _check_one_last_batch(operations, ".shard(mesh) needs one .batch(global_batch_size), as the last operation "
                              "(global batches are split between the JAX processes)")
        filters = [op for op in operations if isinstance(op, FilterTransform)]
        if filters:
            raise ValueError(
                f".shard(mesh) cannot use the filter {filters[0]!r}: a global batch is the next "
                "batch-size records of the sampler order, split between the processes, and a "
                "filter would leave each process a different number; filter the source instead"
            )
        if isinstance(sampler, IndexSampler) and not isinstance(sampler.shard_options, sharding.NoSharding):
            raise ValueError(
                f".shard(mesh) splits every global batch between the processes itself; the sampler "
                f"{sampler!r} reads one shard already: give it NoSharding()"
            )
        from grainlike.core.batch_slice import BatchSliceSampler
        from grainlike.jax.device_iterator import process_data_shards

        import jax

        batch = operations.pop()
        first, end, count = process_data_shards(self.mesh, self.data_axis)
        sliced = BatchSliceSampler(sampler, batch.batch_size, count, first, end,
                                   drop_remainder=batch.drop_remainder)
        if batch.pad and sliced.last_rows:
            raise ValueError(
                f".shard(mesh) with {batch!r}: the last global batch is short and pad=True "
                "would pad each process's rows apart; use drop_remainder=True"
            )
        # Each process batches its rows itself; a short last global batch gives
        # each as many rows (BatchSliceSampler checks), so nothing is dropped here.
        local = Batch(sliced.rows, False, batch.batch_fn, batch.pad)
        spec = jax.sharding.PartitionSpec(self.data_axis)
        return BuiltLoader(
            batch=local if self.worker_count > 0 else None,
            read_ahead=None,
            device_sharding=jax.sharding.NamedSharding(self.mesh, spec),
            device_prefetch=self.prefetch_ or 0,
            **self._loader_args(sliced, operations if self.worker_count > 0 else operations + [local]),
        )

    def _loader_args(self, sampler: Any, operations: list) -> dict:
        """The DataLoader's arguments; ``prefetch(n)`` with workers sets their buffer."""
        workers = self.worker_count
        buffer = -(-self.prefetch_ // workers) if self.prefetch_ and workers else self.worker_buffer_size
        # With a mesh, the sampler itself takes this process's rows (BatchSliceSampler).
        shard_options = sharding.NoSharding() if self.mesh is not None else self.shard_options
        return dict(data_source=self.source, sampler=sampler, operations=operations, worker_count=workers,
                    worker_buffer_size=buffer, shard_options=shard_options, read_options=self.read_options)

    def __iter__(self):
        """Iterating the builder iterates ``build()``."""
        return iter(self.build())


class BuiltLoader(DataLoader):
    """A DataLoader that also batches after its workers, reads ahead or makes global arrays.

    Made by ``LoaderBuilder.build()`` for ``batch(..., global_order=True)`` with
    workers, ``prefetch(n)`` without workers, or ``shard(mesh)``; otherwise the
    builder returns a plain ``DataLoader``. Its iterators' states are the
    wrapped loader's states.

    Args:
      batch: batches the workers' records in their global order, in this process.
      read_ahead: outputs read ahead in a background thread.
      device_sharding: the sharding of each batch's global ``jax.Array`` leaves,
        assembled from this process's rows by a ``DeviceIterator``.
      device_prefetch: batches that ``DeviceIterator`` assembles ahead.
    """

    def __init__(self, *, batch: Optional[Batch], read_ahead: Optional[int],
                 device_sharding: Any = None, device_prefetch: int = 0, **kwargs: Any):
        super().__init__(**kwargs)
        self._global_batch = batch
        self._read_ahead = read_ahead
        self._device_sharding = device_sharding
        self._device_prefetch = device_prefetch

    def __iter__(self) -> Any:
        it: Any = super().__iter__()
        if self._global_batch is not None:
            it = _GlobalBatchIterator(it, self._global_batch)
        if self._read_ahead is not None:
            it = _BuiltLoaderReadAhead(it, self._read_ahead)
        if self._device_sharding is not None:
            from grainlike.jax.device_iterator import DeviceIterator

            it = DeviceIterator(it, self._device_sharding, prefetch=self._device_prefetch)
        return it

    def __len__(self) -> int:
        if self._global_batch is None:
            return super().__len__()
        records = super().__len__()
        size = self._global_batch.batch_size
        return records // size if self._global_batch.drop_remainder else -(-records // size)


class _GlobalBatches:
    """Batches the records the workers return, in their global order, in this process."""

    def __init__(self, records: Any, op: Batch):
        self._records = records
        self._op = op

    def __next__(self) -> Any:
        op = self._op
        values = list(itertools.islice(self._records, op.batch_size))
        if not values or (len(values) < op.batch_size and op.drop_remainder):
            raise StopIteration
        return batch_elements(op, values)


class _GlobalBatchIterator(ReadAhead):
    """The loader iterator's records batched in this process; its states are the loader iterator's."""

    def __init__(self, inner: Any, op: Batch):
        super().__init__(inner, 0, "BuiltLoader iterator", items=_GlobalBatches(inner, op))


class _BuiltLoaderReadAhead(ReadAhead):
    """Reads ``size`` outputs ahead in a background thread; states follow what was delivered."""

    def __init__(self, inner: Any, size: int):
        super().__init__(inner, size, "BuiltLoader iterator")


def from_source(source: Any) -> LoaderBuilder:
    """Starts a LoaderBuilder over a random-access source (``len`` and ``[key]``).

    A finite ``tf.data.Dataset`` is read once into memory (``TfDataSource``; its
    docstring says what it needs).

    Example:
      loader = (grainlike.from_source(source).shuffle(0).map(decode)
                .random_map(augment).filter(keep).batch(128).epochs(2)
                .workers(2).prefetch(2).build())
    """
    if is_tf_dataset(source):
        source = TfDataSource(source)
    return LoaderBuilder(source)

