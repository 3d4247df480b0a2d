"""DataLoader: grain's ``grain.python.DataLoader`` API, composed of Dataset stages."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import warnings
from typing import Any, Iterator, Optional, Sequence

from grainlike.core import monitoring, sharding
from grainlike.core.errors import ClosedIteratorError, InvalidStateError, WorkersDropRemaindersWarning
from grainlike.core.protocols import ClosesOnExit, OrbaxCheckpointable
from grainlike.core.transforms import Batch, FilterTransform, Map, MapWithIndex, RandomMap, is_flat_map
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.dataset_node import parents
from grainlike.dataset.nodes.iterator import close_dropped
from grainlike.loader import elastic_restore as elastic
from grainlike.loader import pipeline
from grainlike.sources.tf_data import TfDataSource, is_tf_dataset
from grainlike.loader import legacy_state as state_lib
from grainlike.dataset.nodes.options import MultiprocessingOptions, ReadOptions
from grainlike.sources.protocol import PinsRemoteObjects


def _warn_if_worker_shares_below_batch(worker_lengths: Sequence[int], operations: Sequence[Any]) -> None:
    """Warns when a worker's share of the records is smaller than the first batch.

    Each worker batches only its own records (worker ``w`` reads ``w, w + W, ...``,
    as in grain), so with fewer records than ``worker_count * batch_size`` some
    batches are partial (or dropped with ``drop_remainder=True``) although a
    process without workers would fill them. The output stays grain's.
    """
    if len(worker_lengths) < 2:
        return
    batch = next((op for op in operations if isinstance(op, Batch)), None)
    if batch is None or min(worker_lengths) >= batch.batch_size:
        return
    records = sum(worker_lengths)
    fit = max(1, records // batch.batch_size)
    effect = (
        "drops those records (drop_remainder=True)"
        if batch.drop_remainder
        else f"delivers batches of fewer than {batch.batch_size} elements"
    )
    warnings.warn(
        f"DataLoader(worker_count={len(worker_lengths)}) reads {records} records; each worker "
        f"batches only its own share, and {sum(n < batch.batch_size for n in worker_lengths)} "
        f"of the workers get fewer than the {batch.batch_size} of {batch}, so the loader "
        f"{effect} (as grain does). Use worker_count={fit}{' or 0' if fit == 1 else ' or fewer'}, "
        "or a smaller batch_size.",
        WorkersDropRemaindersWarning,
        stacklevel=3,
    )


def _determine_worker_count(input_worker_count: Optional[int]) -> int:
    """grain's rule for a worker count: the one given, as an int; ``None``: one per CPU.

    grain's private helper of this name (``grain._src.python.data_loader``), which
    projects import to size their own pools; it checks nothing else.

    Raises:
      ValueError: ``None`` and the number of CPUs is unknown.
    """
    if input_worker_count is not None:
        return int(input_worker_count)
    cpus = os.cpu_count()
    if cpus is None:
        raise ValueError("Can't determine worker count. Please set worker count.")
    return cpus


def _checked_worker_count(worker_count: Optional[int]) -> int:
    """The DataLoader's ``worker_count``, checked, with ``None`` as one per CPU."""
    if worker_count is not None:
        if isinstance(worker_count, bool) or not isinstance(worker_count, int):
            raise TypeError(f"worker_count must be an int or None, got {worker_count!r}")
        if worker_count < 0:
            raise ValueError(
                "Worker count should be greater than or equal zero. "
                f"Current worker_count is {worker_count}."
            )
    return _determine_worker_count(worker_count)


class DataLoader:
    """Reads records chosen by a sampler, transforms and batches them.

    A drop-in for ``grain.python.DataLoader``: the same arguments, the same
    records in the same order, and the same checkpoint state. As in grain, it is
    a pipeline of Dataset stages (see ``grainlike.loader.pipeline``): the sampler's
    records, read in chunks; ``ds.map``, ``ds.filter`` and ``ds.batch`` with the
    operations (a batch over maps and filters takes whole chunks of records);
    with workers, ``mp_prefetch``; and at the top grain's legacy JSON state.

    Args:
      data_source: random-access source: ``len(source)`` and ``source[key]``; a
        finite ``tf.data.Dataset`` is read once into memory (``TfDataSource``).
      sampler: maps global indices to records, e.g. ``IndexSampler``.
      operations: transforms applied in order (Map, RandomMap, Filter,
        MapWithIndex, Batch, and grain's legacy operations).
      worker_count: worker processes; 0 runs in the calling process, None uses one
        per CPU.
      worker_buffer_size: finished outputs each worker keeps ready.
      shard_options: which shard of the data this process loads; defaults to the
        sampler's shard options.
      read_options: read-ahead threads and buffer per process; a given
        ReadOptions is used as it is, as in grain. Left as None, sources whose
        reads wait (remote files, sources of your own types) are read in grain's
        16 threads, and sources known to be local and CPU-bound (in memory,
        local ArrayRecord / Parquet / TFDS / Hugging Face files, or declaring
        ``waits = False``) in the calling thread, where batched reads are
        fastest. See "What runs in threads by default" in docs/performance.md.
      enable_profiling: log per-stage timings of the workers.
      warm_start: with workers, compute the first outputs in the calling process
        while the workers start (same outputs, order and states), so the first
        batch arrives after one in-process batch rather than a worker start
        (process start, imports, unpickling the pipeline). Off by default: with
        workers, transforms run only in the workers. grainlike only; grain has
        no such argument.
      stall_timeout_s: a worker that makes no progress for this many seconds
        (stuck in one call: a deadlock, a hung read, a stopped process) raises
        ``grainlike.WorkerStalledError`` naming it, its pid, its state and its
        Python stack. None or 0 turns the check off. grainlike only.

    Example:
      >>> import grainlike as grain
      >>> loader = grain.DataLoader(
      ...     data_source=grain.RangeDataSource(0, 10, 1),
      ...     sampler=grain.IndexSampler(10, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
      ...     operations=[grain.Batch(4)],
      ... )
      >>> [b.tolist() for b in loader]
      [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    """

    def __init__(
        self,
        *,
        data_source: Any,
        sampler: Any,
        operations: Sequence[Any] = (),
        worker_count: Optional[int] = 0,
        worker_buffer_size: int = 1,
        shard_options: Optional[sharding.ShardOptions] = None,
        read_options: Optional[ReadOptions] = None,
        enable_profiling: bool = False,
        warm_start: bool = False,
        stall_timeout_s: Optional[float] = 300.0,
    ):
        worker_count = _checked_worker_count(worker_count)
        if isinstance(worker_buffer_size, bool) or not isinstance(worker_buffer_size, int):
            raise TypeError(f"worker_buffer_size must be an int, got {worker_buffer_size!r}")
        if worker_buffer_size < 0:
            raise ValueError(
                "Worker buffer size must be greater than or equal zero. "
                f"Current worker_buffer_size is {worker_buffer_size}."
            )
        if shard_options is None:
            # As grain: a sampler of the user's own (or grain's IndexSampler) may
            # carry the shard options it was made with.
            shard_options = getattr(sampler, "_shard_options", None)
            if not isinstance(shard_options, sharding.ShardOptions):
                raise ValueError(
                    "No shard options were provided to the DataLoader. Please pass "
                    "shard options to the DataLoader. Previously sharding was handled "
                    "by the Sampler but going forward sharding will be handled by the "
                    "DataLoader for greater flexibility. For example "
                    "shard_options=grainlike.NoSharding() (or ShardByJaxProcess() / "
                    "ShardOptions(...))."
                )
        if not isinstance(shard_options, sharding.ShardOptions):
            raise TypeError(f"shard_options must be a ShardOptions, got {shard_options!r}")
        if is_tf_dataset(data_source):
            data_source = TfDataSource(data_source)
        self._data_source = data_source
        self._sampler = sampler
        self._operations = pipeline.check_operations(operations)
        self._shard_options = shard_options
        self._read_options = read_options or ReadOptions()
        self._given_read_options = read_options
        self._multiprocessing_options = MultiprocessingOptions(
            num_workers=worker_count,
            per_worker_buffer_size=max(worker_buffer_size, 1),
            enable_profiling=enable_profiling,
            warm_start=bool(warm_start),
            stall_timeout_s=stall_timeout_s,
        )
        self._records = pipeline.SamplerMapDataset(data_source, sampler, shard_options)
        self._locator = self._records.locator
        self._local_length = self._records.local_length
        self._codec = state_lib.LegacyState(
            worker_count=worker_count,
            shard_index=shard_options.shard_index,
            shard_count=shard_options.shard_count,
            sampler_repr=repr(sampler),
            data_source_repr=state_lib.source_repr(data_source),
            worker_lengths=tuple(state_lib.worker_lengths(self._local_length, worker_count)),
        )
        self._dataset = self._loader_dataset(self._records)
        _warn_if_worker_shares_below_batch(self._codec.worker_lengths, self._operations)
        if worker_count > 0:
            from grainlike.workers import start

            start.prestart()

    @property
    def multiprocessing_options(self) -> MultiprocessingOptions:
        return self._multiprocessing_options

    @property
    def read_options(self) -> ReadOptions:
        return self._read_options

    @property
    def shard_options(self) -> sharding.ShardOptions:
        return self._shard_options

    @property
    def sampler(self) -> Any:
        return self._sampler

    @property
    def data_source(self) -> Any:
        return self._data_source

    @property
    def operations(self) -> list:
        return list(self._operations)

    @property
    def worker_count(self) -> int:
        return self._multiprocessing_options.num_workers

    def _check_padding(self) -> None:
        if self._locator.batch_padding is not None:
            pipeline.check_padding_sampler(self._locator, self._operations, self.worker_count)

    def __iter__(self) -> "DataLoaderIterator":
        self._check_padding()
        return DataLoaderIterator(self)

    def __len__(self) -> int:
        """Number of outputs one full pass yields.

        Raises:
          TypeError: the sampler repeats forever, or a FilterTransform makes the
            count unknowable without running the pipeline.
        """
        if self._local_length >= sys.maxsize // max(self._shard_options.shard_count, 1):
            raise TypeError("len() of an infinite DataLoader (the sampler has num_epochs=None)")
        if any(isinstance(op, FilterTransform) for op in self._operations):
            raise TypeError(
                "len() of a DataLoader with a FilterTransform is unknown until it has run"
            )
        flat_maps = [op for op in self._operations if is_flat_map(op)]
        if flat_maps:
            raise TypeError(
                f"len() of a DataLoader with the FlatMapTransform {flat_maps[0]!r} is unknown until it has run"
            )
        known = (Batch, Map, RandomMap, MapWithIndex)
        legacy = [op for op in self._operations if not isinstance(op, known)]
        if legacy:
            raise TypeError(
                f"len() of a DataLoader with the legacy operation {legacy[0]!r} is unknown "
                "until it has run"
            )
        total = 0
        for count in self._codec.worker_lengths:
            for op in self._operations:
                if isinstance(op, Batch):
                    count = count // op.batch_size if op.drop_remainder else -(-count // op.batch_size)
            total += count
        return total

    def _loader_dataset(self, records: pipeline.SamplerMapDataset) -> IterDataset:
        """The whole pipeline over ``records``, with grain's legacy state at the top."""
        return pipeline.loader_dataset(
            records, self._operations, self._given_read_options, self._multiprocessing_options, self._codec
        )

    def _reading(self, source: Any) -> IterDataset:
        """The pipeline reading ``source``, a copy of the data source at other object versions."""
        if len(source) != len(self._data_source):
            raise InvalidStateError(
                f"the state was saved on versions of {self._data_source!r}'s remote objects that "
                f"hold {len(source)} records; the source now holds {len(self._data_source)}. Build "
                "the loader on the data the checkpoint was taken on."
            )
        return self._loader_dataset(pipeline.SamplerMapDataset(source, self._sampler, self._shard_options))

    def _encode(self, positions: state_lib.Positions) -> bytes:
        """The ``get_state()`` bytes of an iterator at ``positions``."""
        return state_lib.dumps(self._codec.encode(positions))


class DataLoaderIterator(OrbaxCheckpointable, ClosesOnExit, Iterator[Any]):
    """Iterates a DataLoader; its position can be saved and restored (also by Orbax v1: ``save``/``load``).

    ``get_state()`` returns grain's JSON state bytes; ``set_state()`` accepts states
    written by grain or grainlike for the same pipeline. Worker processes (if any)
    start on the first ``next()`` (or ``start_prefetch()``) and stop on ``close()``,
    at the end of a ``with`` block, when the iterator is garbage collected, or at
    interpreter exit. After an exception in ``next()`` (a transform's error, a
    worker that died, Ctrl-C) the next call goes on from the last delivered
    output.

    Example:
      >>> import grainlike as grain
      >>> loader = grain.DataLoader(
      ...     data_source=[10, 11, 12, 13],
      ...     sampler=grain.SequentialSampler(4, grain.NoSharding()),
      ... )
      >>> with iter(loader) as it:
      ...     first = next(it)
      ...     saved = it.get_state()
      ...     rest = list(it)
      >>> it2 = iter(loader); it2.set_state(saved); list(it2) == rest
      True
    """

    def __init__(self, loader: DataLoader):
        self._loader = loader
        # The source read and its pipeline: the loader's, or after a restore onto
        # remote objects changed since the save, a copy at the saved versions.
        self._source = loader.data_source
        self._dataset = loader._dataset
        self._iterator = self._dataset.__iter__()
        self._closed = False
        self._lock = threading.RLock()

    def __iter__(self) -> "DataLoaderIterator":
        return self

    def __next__(self) -> Any:
        # grain's latency of next() (grainlike.monitoring), measured only while telemetry is on.
        start = monitoring.recording and time.perf_counter_ns()
        try:
            with self._lock:
                if self._closed:
                    raise ClosedIteratorError("DataLoaderIterator is closed; create a new one with iter(loader)")
                return next(self._iterator)
        finally:
            if start:
                monitoring.exported().iterator_get_next.Record(time.perf_counter_ns() - start)

    @property
    def _stream(self) -> Any:
        """The worker pool running now (None: no worker runs); for diagnostics."""
        from grainlike.dataset.parallel.mp_prefetch import MultiprocessPrefetchDatasetIterator

        workers = parents(self._iterator)
        return workers[0]._pool if workers and isinstance(workers[0], MultiprocessPrefetchDatasetIterator) else None

    def start_prefetch(self) -> None:
        """Starts the workers now, so the first batch is ready sooner."""
        with self._lock:
            if self._closed:
                raise ClosedIteratorError("DataLoaderIterator is closed; create a new one with iter(loader)")
            self._iterator.start_prefetch()

    def _guard(self) -> Any:
        """The lock ``next()`` holds, for calls from other threads.

        With workers, ``close()`` and ``get_state()`` do not wait behind a blocked
        ``next()``: the worker pool keeps its states consistent and ends a
        ``next()`` waiting for a worker when it is closed. In process, a state taken
        halfway through a batch would be wrong, so they wait for ``next()``.
        """
        return contextlib.nullcontext() if self._loader.worker_count else self._lock

    def get_state(self) -> bytes:
        """The position of the iterator as grain's JSON state (bytes)."""
        with self._guard():
            return state_lib.dumps(self._with_pins(self._iterator.get_state()))

    def _with_pins(self, state: dict) -> dict:
        """``state`` and the versions of the remote objects read (none for local sources)."""
        if isinstance(self._source, PinsRemoteObjects):
            pins = self._source.object_pins()
            if pins:
                state[state_lib.OBJECTS_KEY] = pins
        return state

    def set_state(self, state: bytes) -> None:
        """Restores a position from ``get_state()`` of grain or grainlike.

        The state is checked completely before anything changes; an invalid state
        leaves the iterator where it was. A state naming versions of remote
        objects (``PinsRemoteObjects``) that have changed since is read at those
        versions where the store keeps them; a state without them (grain's)
        reads the objects as they are now.

        Raises:
          InvalidStateError (a ValueError): malformed state, or a state of another
            pipeline (sampler, source, worker count).
          ObjectChangedError: a remote object was overwritten since the state was
            saved and the store does not keep the saved version.
          TypeError: state is not bytes.
        """
        data = state_lib.parse(state)
        pins = data.pop(state_lib.OBJECTS_KEY, None)
        with self._lock:
            source, dataset = self._source, self._dataset
            if pins is not None and isinstance(source, PinsRemoteObjects):
                source = source.at_versions(pins)
                if source is not self._source:
                    dataset = self._loader._reading(source)
            if self._closed or dataset is not self._dataset:
                # A closed iterator restarts from the state it is given, and one
                # reading other versions starts a pipeline of its own.
                fresh = dataset.__iter__()
                try:
                    fresh.set_state(data)
                except BaseException:
                    fresh.close()
                    raise
                old, self._iterator, self._closed = self._iterator, fresh, False
                self._source, self._dataset = source, dataset
                old.close()
                return
            self._iterator.set_state(data)

    def close(self) -> None:
        """Stops the workers and releases their resources. Idempotent.

        From another thread, with workers, it ends a ``next()`` waiting for a
        worker (which raises ``ClosedIteratorError``, a ValueError and a
        RuntimeError); ``next()`` after ``close()`` raises it too.
        """
        with self._guard():
            self._closed = True
            self._iterator.close()

    def __del__(self):
        closer = close_dropped  # None while the interpreter tears the module down at exit
        if closer is not None:
            closer(self)

    def __str__(self) -> str:
        return f"PyGrainDatasetIterator(state={self.get_state().decode()})"

    def _merge_process_states(self, texts: dict, old_count: int) -> str:
        """This process's state text continuing ``old_count`` processes' ``texts`` (by process index).

        What makes this iterator a ``core.state_files.ProcessStatesMerger``: a
        checkpoint of another number of JAX processes restores into it.
        """
        positions = elastic.process_states(self._loader, texts, old_count)
        state = self._loader._codec.encode(positions)
        # Every process read the same versions: any process's pins are the checkpoint's.
        for text in texts.values():
            pins = state_lib.parse(text).get(state_lib.OBJECTS_KEY)
            if pins is not None:
                state[state_lib.OBJECTS_KEY] = pins
                break
        return state_lib.dumps(state).decode()


PyGrainDatasetIterator = DataLoaderIterator
