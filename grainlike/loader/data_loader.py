"""DataLoader: grain's ``grain.python.DataLoader`` API, in process or with workers."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Iterator, Optional, Sequence

from grainlike.core import sharding
from grainlike.core.transforms import Batch, FilterTransform, Map, MapWithIndex, RandomMap
from grainlike.loader import state as state_lib
from grainlike.loader.options import MultiprocessingOptions, ReadOptions
from grainlike.loader.pipeline import Pipeline, check_operations


def _determine_worker_count(worker_count: Optional[int]) -> int:
    if worker_count is None:
        return os.cpu_count() or 1
    if isinstance(worker_count, bool) or not isinstance(worker_count, int):
        raise TypeError(f"worker_count must be an int or None, got {worker_count!r}")
    if worker_count < 0:
        raise ValueError(
            "Worker count should be greater than or equal zero."
            f"Current worker_count is {worker_count}."
        )
    return worker_count


class DataLoader:
    """Reads records chosen by a sampler, transforms and batches them.

    A drop-in for ``grain.python.DataLoader``: the same arguments, the same
    records in the same order, and the same checkpoint state.

    Args:
      data_source: random-access source: ``len(source)`` and ``source[key]``.
      sampler: maps global indices to records, e.g. ``IndexSampler``.
      operations: transforms applied in order (Map, RandomMap, Filter,
        MapWithIndex, Batch).
      worker_count: worker processes; 0 runs in the calling process, None uses one
        per CPU.
      worker_buffer_size: finished outputs each worker keeps ready.
      shard_options: which shard of the data this process loads; defaults to the
        sampler's shard options.
      read_options: read-ahead threads and buffer per process. Left as None,
        sources in memory and local ArrayRecord files are read without threads
        (their batched reads are faster alone, see docs/performance.md); other
        sources get grain's default of 16 threads if reading their first record
        mostly waited (I/O) rather than computed, and none otherwise. A given
        ReadOptions is used as it is.
      enable_profiling: log per-stage timings of the workers.
      warm_start: with workers, compute the first outputs in the calling process
        while the workers start (same outputs, order and states), so the first
        batch arrives after one in-process batch rather than a worker start
        (process start, imports, unpickling the pipeline). Off by default: with
        workers, transforms run only in the workers. grainlike only; grain has
        no such argument.

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
    ):
        worker_count = _determine_worker_count(worker_count)
        if isinstance(worker_buffer_size, bool) or not isinstance(worker_buffer_size, int):
            raise TypeError(f"worker_buffer_size must be an int, got {worker_buffer_size!r}")
        if worker_buffer_size < 0:
            raise ValueError(
                "Worker buffer size must be greater than or equal zero."
                f"Current worker_buffer_size is {worker_buffer_size}."
            )
        if shard_options is None:
            shard_options = getattr(sampler, "_shard_options", None)
            if not isinstance(shard_options, sharding.ShardOptions):
                raise ValueError(
                    "No shard options were provided to the DataLoader. Pass "
                    "shard_options=grainlike.NoSharding() (or ShardByJaxProcess() / "
                    "ShardOptions(...)) to the DataLoader."
                )
        if not isinstance(shard_options, sharding.ShardOptions):
            raise TypeError(f"shard_options must be a ShardOptions, got {shard_options!r}")
        threads_chosen = read_options is not None
        if read_options is None:
            read_options = ReadOptions()
        self._data_source = data_source
        self._sampler = sampler
        self._operations = check_operations(operations)
        self._shard_options = shard_options
        self._read_options = read_options
        self._multiprocessing_options = MultiprocessingOptions(
            num_workers=worker_count,
            per_worker_buffer_size=max(worker_buffer_size, 1),
            enable_profiling=enable_profiling,
            warm_start=bool(warm_start),
        )
        self._pipeline = Pipeline(
            data_source, sampler, self._operations, shard_options, read_options
        )
        self._pipeline.threads_chosen = threads_chosen
        if worker_count > 0:
            from grainlike.dataset import workers

            workers.prestart()

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

    def __iter__(self) -> "DataLoaderIterator":
        return DataLoaderIterator(self)

    def __len__(self) -> int:
        """Number of outputs one full pass yields.

        Raises:
          TypeError: the sampler repeats forever, or a FilterTransform makes the
            count unknowable without running the pipeline.
        """
        if self._pipeline.local_length >= sys.maxsize // max(self._shard_options.shard_count, 1):
            raise TypeError("len() of an infinite DataLoader (the sampler has num_epochs=None)")
        if any(isinstance(op, FilterTransform) for op in self._operations):
            raise TypeError(
                "len() of a DataLoader with a FilterTransform is unknown until it has run"
            )
        known = (Batch, Map, RandomMap, MapWithIndex)
        legacy = [op for op in self._operations if not isinstance(op, known)]
        if legacy:
            raise TypeError(
                f"len() of a DataLoader with the legacy operation {legacy[0]!r} is unknown "
                "until it has run"
            )
        w = max(self.worker_count, 1)
        total = 0
        for i in range(w):
            count = self._pipeline.worker_length(i, self.worker_count)
            for op in self._operations:
                if isinstance(op, Batch):
                    count = count // op.batch_size if op.drop_remainder else -(-count // op.batch_size)
            total += count
        return total

    # -- state helpers used by the iterator ---------------------------------------

    def _initial_positions(self) -> state_lib.Positions:
        return state_lib.Positions([0] * max(self.worker_count, 1), 0)

    def _worker_lengths(self) -> list[int]:
        return [
            self._pipeline.worker_length(i, self.worker_count)
            for i in range(max(self.worker_count, 1))
        ]

    def _encode(self, positions: state_lib.Positions) -> bytes:
        return state_lib.encode(
            positions,
            self.worker_count,
            self._shard_options.shard_index,
            self._shard_options.shard_count,
            repr(self._sampler),
            state_lib.source_repr(self._data_source),
        )

    def _decode(self, state: Any) -> state_lib.Positions:
        return state_lib.decode(
            state,
            worker_count=self.worker_count,
            shard_index=self._shard_options.shard_index,
            shard_count=self._shard_options.shard_count,
            sampler_repr=repr(self._sampler),
            data_source_repr=state_lib.source_repr(self._data_source),
            worker_lengths=self._worker_lengths(),
        )

    def _open_stream(self, positions: state_lib.Positions):
        if self.worker_count == 0:
            return _InProcessStream(self._pipeline, positions)
        from grainlike.loader.pipeline_task import PipelineWorkers

        return PipelineWorkers(
            self._pipeline,
            worker_count=self.worker_count,
            positions=positions,
            options=self._multiprocessing_options,
        )


class _InProcessStream:
    """worker_count=0: the pipeline runs in the calling thread."""

    def __init__(self, pipeline: Pipeline, positions: state_lib.Positions):
        self.positions = state_lib.Positions(list(positions.next_positions), 0)
        self._length = pipeline.worker_length(0, 0)
        self._outputs = pipeline.outputs(0, 0, positions.next_positions[0])
        self.broken = False

    def __next__(self) -> Any:
        try:
            position, output = next(self._outputs)
        except StopIteration:
            # Trailing records a filter dropped were read too.
            self.positions.next_positions[0] = self._length
            raise
        except BaseException:
            # A generator that raised cannot resume; the iterator restarts from
            # the last delivered position on the next call.
            self.broken = True
            raise
        self.positions.next_positions[0] = position
        return output

    def start(self) -> None:
        """Nothing runs ahead in process."""

    def close(self) -> None:
        self._outputs.close()


class DataLoaderIterator(Iterator[Any]):
    """Iterates a DataLoader; its position can be saved and restored.

    ``get_state()`` returns grain's JSON state bytes; ``set_state()`` accepts states
    written by grain or grainlike for the same pipeline. Worker processes (if any)
    start on the first ``next()`` (or ``start_prefetch()``) and stop on ``close()``,
    at the end of a ``with`` block, when the iterator is garbage collected, or at
    interpreter exit.

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
        self._positions = loader._initial_positions()
        self._stream = None
        self._closed = False
        self._lock = threading.RLock()

    def __iter__(self) -> "DataLoaderIterator":
        return self

    def _ensure_stream(self):
        if self._closed:
            raise RuntimeError("DataLoaderIterator is closed; create a new one with iter(loader)")
        if self._stream is None:
            self._stream = self._loader._open_stream(self._positions)
        return self._stream

    def __next__(self) -> Any:
        with self._lock:
            stream = self._ensure_stream()
            try:
                return next(stream)
            except StopIteration:
                raise
            except BaseException:
                if stream.broken:
                    self._stream = None
                    self._positions = stream.positions
                    stream.close()
                raise

    def start_prefetch(self) -> None:
        """Starts the workers now, so the first batch is ready sooner."""
        with self._lock:
            self._ensure_stream().start()

    def get_state(self) -> bytes:
        """The position of the iterator as grain's JSON state (bytes)."""
        with self._lock:
            positions = self._stream.positions if self._stream is not None else self._positions
            return self._loader._encode(positions)

    def set_state(self, state: bytes) -> None:
        """Restores a position from ``get_state()`` of grain or grainlike.

        The state is checked completely before anything changes; an invalid state
        leaves the iterator where it was.

        Raises:
          InvalidStateError (a ValueError): malformed state, or a state of another
            pipeline (sampler, source, worker count).
          TypeError: state is not bytes.
        """
        positions = self._loader._decode(state)
        with self._lock:
            self._close_stream()
            self._positions = positions
            self._closed = False

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            self._positions = stream.positions
            stream.close()

    def close(self) -> None:
        """Stops the workers and releases their resources. Idempotent."""
        with self._lock:
            self._close_stream()
            self._closed = True

    def __enter__(self) -> "DataLoaderIterator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __str__(self) -> str:
        return f"PyGrainDatasetIterator(state={self.get_state().decode()})"

    async def save(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable``: the state is read now, written later."""
        from grainlike import checkpoint  # Only when Orbax calls it.

        return await checkpoint.save_state_async(self, directory)

    async def load(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable``: restores from ``directory``."""
        from grainlike import checkpoint

        return await checkpoint.load_state_async(self, directory)


PyGrainDatasetIterator = DataLoaderIterator
