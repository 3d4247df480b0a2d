"""What one worker (or the calling process, with no workers) computes.

A ``Pipeline`` is the picklable description of the work: source, sampler, sharding
and operations. ``Pipeline.outputs(worker_index, worker_count, next_position)``
yields the worker's outputs with its position after each, where positions count the
worker's slice of the shard-local stream: worker ``w`` of ``W`` reads local
positions ``w, w + W, w + 2W, ...`` and position ``k`` means the ``k``-th of them.
The loader's checkpoint state is these positions and nothing else.
"""

from __future__ import annotations

import collections
import concurrent.futures
import copy
import time
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from grainlike.core import tree
from grainlike.core.errors import add_note
from grainlike.core.operations import loader_operation
from grainlike.core.record import LazyRng, Record, RecordMetadata
from grainlike.core.samplers import as_sampler
from grainlike.core.sharding import ShardOptions
from grainlike.core.transforms import (
    Batch,
    FilterTransform,
    MapTransform,
    MapWithIndexTransform,
    RandomMapTransform,
    transform_name,
)
from grainlike.loader.options import ReadOptions

# Records read per call to the source's batched read: at most this many, and
# about _CHUNK_BYTES worth. Small records gain from big batched reads (ArrayRecord
# reads 256 keys ~10x faster than one at a time); big records must still be in
# cache when they are transformed and batched (256 KiB records read 64 MiB at a
# time ran at half the speed of 8 MiB at a time). The first chunk is one record,
# to learn the record size before a big read (and not to delay the first batch).
_READ_CHUNK = 256
_FIRST_CHUNK = 1
_CHUNK_BYTES = 8 << 20
# With the default ReadOptions, a source of unknown kind gets read threads only if
# its first chunk spent most of its time waiting (I/O), not computing.
_IO_BOUND_CPU_SHARE = 0.5
_CHEAP_CHUNK_S = 2e-4


def describe_op(op: Any) -> str:
    if isinstance(op, Batch):
        pad = ", pad=True" if op.pad else ""
        return f"Batch(batch_size={op.batch_size}, drop_remainder={op.drop_remainder}{pad})"
    return transform_name(op)


def check_operations(operations: Sequence[Any]) -> list:
    """Validates the operations list; returns what the loader runs for each."""
    return [loader_operation(op, i) for i, op in enumerate(operations)]


class Pipeline:
    """The picklable work of one loader: read, transform, filter and batch.

    Args:
      data_source: random-access source (``len`` and ``[key]``; ``__getitems__``
        is used when present).
      sampler: a grainlike sampler, or any object with grain's ``__getitem__
        -> RecordMetadata`` (wrapped by ``as_sampler``).
      operations: the transforms, in order.
      shard_options: which shard this process reads.
      read_options: read-ahead threads and buffer.
    """

    def __init__(
        self,
        data_source: Any,
        sampler: Any,
        operations: Sequence[Any],
        shard_options: ShardOptions,
        read_options: ReadOptions,
    ):
        self.data_source = data_source
        self.sampler = sampler
        # The sampler contract, asked for a whole chunk of indices at a time.
        self.locator = as_sampler(sampler)
        self.operations = check_operations(operations)
        self.shard_options = shard_options
        self.read_options = read_options
        self.local_length = len(self.locator) // shard_options.shard_count
        # Hook for workers: allocates stacked batch leaves (in shared memory).
        self.batch_alloc: Optional[tree.Allocator] = None
        # Whether the user passed ReadOptions (the DataLoader sets it).
        self.threads_chosen = True

    def __getstate__(self):
        state = self.__dict__.copy()
        state["batch_alloc"] = None
        return state

    def worker_length(self, worker_index: int, worker_count: int) -> int:
        """How many positions worker ``worker_index`` of ``worker_count`` reads."""
        w = max(worker_count, 1)
        if self.local_length <= worker_index:
            return 0
        return (self.local_length - worker_index + w - 1) // w

    # -- reading ---------------------------------------------------------------

    def _metadata(self, global_indices: np.ndarray, padding: Optional[set]) -> list:
        """The ``RecordMetadata`` of each index; adds the padding positions to ``padding``."""
        located = self.locator.locate(global_indices)
        if padding is not None and located.padding is not None and located.padding.any():
            padding.update(global_indices[located.padding].tolist())
        if located.metadata is not None:
            return located.metadata
        gs = global_indices.tolist()
        keys = located.keys.tolist()
        if located.seeds is None:
            return [RecordMetadata(g, k, None) for g, k in zip(gs, keys)]
        seeds = located.seeds.tolist()
        return [RecordMetadata(g, k, LazyRng(s)) for g, k, s in zip(gs, keys, seeds)]

    def _read_chunk(self, global_indices: np.ndarray, padding: Optional[set] = None) -> list:
        metas = self._metadata(global_indices, padding)
        source = self.data_source
        keys = [m.record_key for m in metas]
        getitems = getattr(source, "__getitems__", None)
        try:
            if getitems is not None:
                values = getitems(keys)
                return [Record(m, v) for m, v in zip(metas, values)]
        except Exception:
            pass  # Fall through to single reads so the error names the failing key.
        out = []
        for m in metas:
            try:
                value = source[m.record_key]
            except Exception as e:
                add_note(
                    e,
                    f"grainlike: while reading record_key {m.record_key} (global index "
                    f"{m.index}) from data source {_short_repr(source)}",
                )
                # The records before it are still delivered, then the error.
                out.append(_ReadFailure(e))
                return out
            out.append(Record(m, value))
        return out

    def _chunks(
        self, worker_index: int, worker_count: int, start: int, size: list
    ) -> Iterator[np.ndarray]:
        """Yields the global indices of positions ``start, start + 1, ...`` in chunks.

        ``size[0]`` is the next chunk's length; the reader may change it between
        chunks.
        """
        w = max(worker_count, 1)
        end = self.worker_length(worker_index, worker_count)
        s = self.shard_options
        stride = w * s.shard_count
        base = worker_index * s.shard_count + s.shard_index
        lo = start
        while lo < end:
            hi = min(lo + max(size[0], 1), end)
            yield np.arange(lo, hi, dtype=np.int64) * stride + base
            lo = hi

    def _max_chunk(self) -> int:
        return max(1, min(_READ_CHUNK, self.read_options.prefetch_buffer_size or 1))

    def _fit_chunk(self, chunk: list, size: list) -> None:
        """Sets the next chunk length from the size of the records just read."""
        if chunk and type(chunk[0]) is Record:
            per_record = max(tree.estimate_nbytes(chunk[0].data), 1)
            size[0] = max(1, min(self._max_chunk(), _CHUNK_BYTES // per_record))

    def read_threads(self) -> Optional[int]:
        """Read-ahead threads: 0 for sources already in memory, None for "decide".

        Reading from memory is pure Python under the GIL; threads would only add
        contention. Sources that wait on I/O (files, remote storage) get
        ``ReadOptions.num_threads``. With the default ReadOptions, a source of a
        kind grainlike does not know gets None: the first chunk's read decides.
        """
        from grainlike.sources import (
            ArrayRecordDataSource,
            InMemoryDataSource,
            RangeDataSource,
            TfdsDataSource,
        )

        source = self.data_source
        if isinstance(source, (list, tuple, np.ndarray, range, RangeDataSource, InMemoryDataSource)):
            return 0
        if self.threads_chosen or self.read_options.num_threads == 0:
            return self.read_options.num_threads
        if isinstance(source, (ArrayRecordDataSource, TfdsDataSource)):
            # Batched reads of local files come from the page cache; read threads
            # only contend for the GIL with the transforms (measured ~10% slower).
            return 0
        return None

    def records(
        self, worker_index: int, worker_count: int, start: int, padding: Optional[set] = None
    ) -> Iterator[Record]:
        """Yields the worker's records from position ``start`` on, read ahead.

        Global indices the sampler marks as padding are added to ``padding``
        (when given) as their records are read.
        """
        threads = self.read_threads()
        size = [min(_FIRST_CHUNK, self._max_chunk())]
        index_chunks = self._chunks(worker_index, worker_count, start, size)
        if threads is None:
            # Read the first chunk here and see whether it waited or computed.
            idx = next(index_chunks, None)
            if idx is None:
                return
            wall, cpu = time.perf_counter(), time.thread_time()
            chunk = self._read_chunk(idx, padding)
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            io_bound = wall > _CHEAP_CHUNK_S and cpu < _IO_BOUND_CPU_SHARE * wall
            threads = self.read_options.num_threads if io_bound else 0
            self._fit_chunk(chunk, size)
            yield from _delivered(chunk)
        if threads <= 0:
            for idx in index_chunks:
                chunk = self._read_chunk(idx, padding)
                self._fit_chunk(chunk, size)
                yield from _delivered(chunk)
            return
        # Read ahead: keep enough chunk reads in flight to fill the prefetch buffer,
        # and at least one besides the chunk being consumed, so reads overlap work.
        ahead = -(-self.read_options.prefetch_buffer_size // self._max_chunk())
        ahead = min(max(ahead, 2), max(threads * 2, 2))
        pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(threads, ahead), thread_name_prefix="grainlike-read"
        )
        pending: collections.deque = collections.deque()
        try:
            for idx in index_chunks:
                pending.append(pool.submit(self._read_chunk, idx, padding))
                if len(pending) >= ahead:
                    chunk = pending.popleft().result()
                    self._fit_chunk(chunk, size)
                    yield from _delivered(chunk)
            while pending:
                yield from _delivered(pending.popleft().result())
        finally:
            for f in pending:
                f.cancel()
            pool.shutdown(wait=True, cancel_futures=True)

    # -- transforming ------------------------------------------------------------

    def outputs(
        self, worker_index: int, worker_count: int, start: int
    ) -> Iterator[tuple[int, Any]]:
        """Yields ``(position after this output, output)`` for one worker.

        Args:
          worker_index: this worker, in ``[0, max(worker_count, 1))``.
          worker_count: number of workers (0 means one, in process).
          start: the first position to read.
        """
        # Padding positions, from when they are read until the Batch masking them.
        padding: Optional[set] = None
        if self.locator.batch_padding is not None:
            check_padding_sampler(self.locator, self.operations, worker_count)
            padding = set()
        position = [start]
        records = self.records(worker_index, worker_count, start, padding)

        def counted() -> Iterator[Record]:
            for r in records:
                position[0] += 1
                yield r

        stream: Iterator[Record] = counted()
        for op in self.operations:
            stream = _apply(op, stream, self, padding)
        try:
            for r in stream:
                yield position[0], r.data
        finally:
            records.close()


def check_padding_sampler(sampler: Any, operations: Sequence[Any], worker_count: int) -> None:
    """Checks that a sampler padding each epoch (``batch_padding``) fits the pipeline.

    Its padding is masked by the first Batch, which must pad with the sampler's
    batch size, with no filter before it, and with the worker count the sampler was
    made for (each worker batches its own records, so epochs align with batches
    only for that count).

    Raises:
      ValueError: naming the mismatch.
    """
    name = type(sampler).__name__
    batch = None
    for op in operations:
        if isinstance(op, FilterTransform) and batch is None:
            raise ValueError(
                f"{name} pads each epoch to whole batches; a FilterTransform before the "
                f"Batch ({describe_op(op)}) would shift batches across epochs. Filter "
                "after batching, or use IndexSampler."
            )
        if isinstance(op, Batch):
            batch = op
            break
    layout = sampler.batch_padding
    expected_batch = layout.batch_size
    if batch is None or not batch.pad or batch.batch_size != expected_batch:
        got = "no Batch" if batch is None else describe_op(batch)
        raise ValueError(
            f"{name} needs Batch(batch_size={expected_batch}, pad=True) among the "
            f"operations to mask its padding records; got {got}"
        )
    expected_workers = layout.worker_count
    if max(expected_workers, 1) != max(worker_count, 1):
        raise ValueError(
            f"{name} was made for worker_count={expected_workers}, but the loader runs "
            f"{worker_count} workers; each worker batches its own records, so pass the "
            "loader's worker_count to the sampler"
        )


def _with_mask(data: Any, mask: np.ndarray, op: Batch) -> Any:
    """Adds the ``mask`` leaf: a key of a dict batch, else ``{"data": ..., "mask": ...}``."""
    if isinstance(data, dict):
        if "mask" in data:
            raise ValueError(
                f"{describe_op(op)}: the elements already have a 'mask' key, where pad=True "
                "puts the padding mask; rename that key"
            )
        if type(data) is dict:
            return {**data, "mask": mask}
        out = copy.copy(data)  # keeps the subclass (and a defaultdict's factory)
        out["mask"] = mask
        return out
    return {"data": data, "mask": mask}


class _ReadFailure:
    """Ends a chunk whose read failed at this record: the error, raised in order."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


def _delivered(chunk: list) -> Iterator[Record]:
    """The records of a chunk; a failed read raises after the records before it."""
    if chunk and type(chunk[-1]) is _ReadFailure:
        yield from chunk[:-1]
        raise chunk[-1].error
    yield from chunk


def _short_repr(obj: Any, limit: int = 200) -> str:
    try:
        text = repr(obj)
    except Exception:
        text = f"<{type(obj).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(e: BaseException, op: Any, r: Record) -> None:
    m = r.metadata
    key = "" if m.record_key is None else f", record_key {m.record_key}"
    add_note(e, f"grainlike: in transform {describe_op(op)} on the record at global index {m.index}{key}")


def _apply(
    op: Any, stream: Iterator[Record], pipeline: Pipeline, padding: Optional[set]
) -> Iterator[Record]:
    if isinstance(op, MapTransform):
        fn = op.map

        def mapped():
            for r in stream:
                try:
                    r.data = fn(r.data)
                except Exception as e:
                    _fail(e, op, r)
                    raise
                yield r

        return mapped()
    if isinstance(op, RandomMapTransform):
        fn = op.random_map

        def random_mapped():
            for r in stream:
                try:
                    r.data = fn(r.data, r.metadata.rng)
                except Exception as e:
                    _fail(e, op, r)
                    raise
                yield r

        return random_mapped()
    if isinstance(op, MapWithIndexTransform):
        fn = op.map_with_index

        def index_mapped():
            for r in stream:
                try:
                    r.data = fn(r.metadata.index, r.data)
                except Exception as e:
                    _fail(e, op, r)
                    raise
                yield r

        return index_mapped()
    if isinstance(op, FilterTransform):
        fn = op.filter

        def filtered():
            for r in stream:
                try:
                    keep = fn(r.data)
                except Exception as e:
                    _fail(e, op, r)
                    raise
                if keep:
                    yield r

        return filtered()
    if isinstance(op, Batch):
        return _batched(op, stream, pipeline, padding)
    # A legacy grain Operation: a function of the whole stream of records.
    return iter(op(stream))


def _batched(
    op: Batch, stream: Iterator[Record], pipeline: Pipeline, padding: Optional[set]
) -> Iterator[Record]:
    size = op.batch_size
    user_fn = op.batch_fn
    pad = op.pad
    # A padding sampler marks records that fill its epochs up to whole batches; the
    # first padded Batch masks them (check_padding_sampler makes it the first Batch).
    if not pad:
        padding = None
    buf: list = []

    def emit(records: list) -> Record:
        values = [r.data for r in records]
        last = records[-1].metadata
        try:
            if pad:
                mask = np.zeros(size, dtype=bool)
                mask[: len(values)] = True
                if padding:
                    for i, r in enumerate(records):
                        if r.metadata.index in padding:
                            padding.discard(r.metadata.index)
                            mask[i] = False
                            values[i] = tree.zeros_like(values[i])
                if len(values) < size:
                    values.extend([tree.zeros_like(values[0])] * (size - len(values)))
            if user_fn is not None:
                data = user_fn(values)
            else:
                data = tree.stack(values, pipeline.batch_alloc)
            if pad:
                data = _with_mask(data, mask, op)
        except Exception as e:
            idx = [r.metadata.index for r in records]
            keys = [r.metadata.record_key for r in records]
            add_note(
                e,
                f"grainlike: in {describe_op(op)} of the records at global indices "
                f"{idx} (record_keys {keys})",
            )
            if user_fn is None:
                odd = _odd_elements(records, _producer(op, pipeline))
                if odd:
                    add_note(e, odd)
            raise
        return Record(last.remove_record_key(), data)

    for r in stream:
        buf.append(r)
        if len(buf) == size:
            yield emit(buf)
            buf = []
    if buf and not op.drop_remainder:
        yield emit(buf)


def _producer(op: Batch, pipeline: Pipeline) -> str:
    """What made the elements ``op`` batches: the transform before it, or the source."""
    ops = pipeline.operations
    at = next((i for i, o in enumerate(ops) if o is op), len(ops))
    for prev in reversed(ops[:at]):
        if not isinstance(prev, FilterTransform):
            return f"transform {describe_op(prev)}"
    return f"data source {_short_repr(pipeline.data_source)}"


def _odd_elements(records: list, producer: str) -> str:
    """Names the records whose structure or shapes differ from the most common one."""
    try:
        specs = [repr(tree.shape_spec(r.data)) for r in records]
        common, count = collections.Counter(specs).most_common(1)[0]
        if count == len(specs):
            return ""
        odd = [(r, s) for r, s in zip(records, specs) if s != common]
        lines = [
            f"  record_key {r.metadata.record_key} (global index {r.metadata.index}): {s}"
            for r, s in odd[:8]
        ]
        if len(odd) > 8:
            lines.append(f"  ... and {len(odd) - 8} more")
        return (
            f"grainlike: {len(odd)} of the {len(records)} elements differ in structure or "
            f"shape from the other {count}, which are {common} (structure with leaf "
            f"shapes); the elements were produced by {producer}:\n" + "\n".join(lines)
        )
    except Exception:  # Never hide the original error.
        return ""
