"""The DataLoader as a composition of Dataset stages, as grain 0.2.18 composes its own::

    SamplerMapDataset(source, sampler, shard_options)   records the sampler chooses
      .to_iter_dataset(read_options)                    the reading stage: chunks located
                                                        and read at once; after an elastic
                                                        restore it does not deliver the
                                                        positions its state skips
      -> one stage per operation, on records            Map, RandomMap, Filter,
                                                        MapWithIndex, Batch, Operation
      (maps and filters up to the first Batch: one      ChunkedRecordsIterDataset: those
       stage for those operations, over the reading     operations a chunk at a time, on
       of LocatedRecordsMapDataset(records))            the chunks to_iter_dataset()'s
                                                        reading hands over
      -> RecordDataIterDataset                          each record's data
      -> mp_prefetch (worker_count > 0)                 worker w computes positions
                                                        w, w + W, ... of the shard
      -> LoaderStateIterDataset                         grain's legacy JSON state

Positions count the shard's stream: shard-local position ``p`` is the sampler's
global index ``p * shard_count + shard_index``. The state of everything below the
top is the Dataset API's (``{"next_index": p}`` per worker, with the positions still
to skip after an elastic restore: ``dataset.elastic.SkippingReader``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from grainlike.core.operations import loader_operation
from grainlike.core.transforms import (
    Batch,
    FilterTransform,
    MapTransform,
    MapWithIndexTransform,
    RandomMapTransform,
)
from grainlike.dataset.iter_dataset import IterDataset
from grainlike.dataset.options import MultiprocessingOptions, ReadOptions
from grainlike.loader import legacy_state as state_lib
from grainlike.loader.chunked import ChunkedRecordsIterDataset, chunkable
from grainlike.loader.output_stages import LoaderStateIterDataset, RecordDataIterDataset
from grainlike.loader.stages import (
    BatchRecordsIterDataset,
    FilterRecordsIterDataset,
    MapRecordsIterDataset,
    OperationIterDataset,
    SamplerMapDataset,
    describe_op,
    short_repr,
)
from grainlike.core.transforms import is_flat_map
from grainlike.loader.flatmap_records import FlatMapRecordsIterDataset


def check_operations(operations: Sequence[Any]) -> list:
    """Validates the operations list; returns what the loader runs for each."""
    return [loader_operation(op, i) for i, op in enumerate(operations)]


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


def _producer(operations: Sequence[Any], at: int, data_source: Any) -> str:
    """What made the elements ``operations[at]`` receives: the operation before, or the source."""
    for prev in reversed(operations[:at]):
        if not isinstance(prev, FilterTransform):
            return f"transform {describe_op(prev)}"
    return f"data source {short_repr(data_source)}"


def records_dataset(
    records: SamplerMapDataset,
    operations: Sequence[Any],
    read_options: Optional[ReadOptions],
    worker: Optional[tuple[int, int]] = None,
) -> IterDataset:
    """What the calling process computes, or each worker: the operations' outputs.

    Args:
      records: the sampler's records.
      operations: as ``check_operations`` returns them.
      read_options: the loader's ``read_options``: used as given; None reads
        in grain's 16 threads where the source's reads wait and in this thread
        where they are known to be local (``grainlike.sources.waiting``).
      worker: ``(w, W)``: only worker ``w`` of ``W``'s positions ``w, w + W, ...``
        (``mp_prefetch`` slices a copy for each worker itself).
    """
    locator = records.locator
    padding = locator if locator.batch_padding is not None else None
    if worker is not None and worker[1] > 1:
        records = records.slice(slice(worker[0], None, worker[1]))
    ds = records.to_iter_dataset(read_options)
    start = 0
    flat = any(is_flat_map(op) for op in operations)
    if not flat and chunkable(operations):
        # Maps and filters, then a Batch: on chunks of records, with no
        # per-record objects (the same outputs and states).
        start = next(i for i, op in enumerate(operations) if isinstance(op, Batch))
        producer = _producer(operations, start, records.data_source)
        threads = ds.read_threads()
        buffer = ds.read_options.prefetch_buffer_size
        ds = ChunkedRecordsIterDataset(records, operations, start, padding, producer, threads, buffer)
        padding = None
        start += 1
    for i, op in enumerate(operations[start:], start):
        if isinstance(op, (MapTransform, RandomMapTransform, MapWithIndexTransform)):
            ds = MapRecordsIterDataset(ds, op, i)
        elif isinstance(op, FilterTransform):
            ds = FilterRecordsIterDataset(ds, op, i)
        elif isinstance(op, Batch):
            ds = BatchRecordsIterDataset(ds, op, i, padding, _producer(operations, i, records.data_source))
            padding = None  # The first Batch masks the padding (check_padding_sampler).
        elif is_flat_map(op):
            ds = FlatMapRecordsIterDataset(ds, op, i)
        else:
            ds = OperationIterDataset(ds, op, i)
    return RecordDataIterDataset(ds)


def loader_dataset(
    records: SamplerMapDataset,
    operations: Sequence[Any],
    read_options: Optional[ReadOptions],
    multiprocessing_options: MultiprocessingOptions,
    codec: state_lib.LegacyState,
) -> IterDataset:
    """The whole DataLoader: the records' pipeline, its workers and its legacy state."""
    ds = records_dataset(records, operations, read_options)
    if multiprocessing_options.num_workers > 0:
        from grainlike.dataset.mp_prefetch import MultiprocessPrefetchIterDataset

        # A failed worker stops them all; the next next() restarts every worker
        # from its last delivered output (grain's mp_prefetch would go on without
        # the failed worker).
        ds = MultiprocessPrefetchIterDataset(ds, multiprocessing_options, error_ends_worker=False)
    if any(is_flat_map(op) for op in operations):
        # grain checkpoints a loader with a flat map by its Dataset state, not
        # the legacy JSON state (whose positions count records, not splits).
        return ds
    return LoaderStateIterDataset(ds, codec)
