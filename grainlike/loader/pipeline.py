"""The DataLoader as a composition of Dataset stages, as grain 0.2.18 composes its own.

A record's way from the sampler to the caller, and the file of each stage::

    SamplerMapDataset(source, sampler, shard_options)   loader/records.py: the records the
                                                        sampler chooses, by position
      .to_iter_dataset(read_options)                    loader/records.py (reading in chunks:
                                                        dataset/transformations/prefetch.py):
                                                        chunks located and read at once, in
                                                        read threads where reads wait; after
                                                        an elastic restore it does not read
                                                        the positions its state skips
      .map(RecordMap(op)) / .filter(RecordFilter(op))   dataset/transformations/map.py,
      .batch(n, batch_fn=RecordBatch(op))               filter.py, batch.py, with the functions
                                                        of loader/record_transforms.py (Map,
                                                        RandomMap and MapWithIndex are maps)
      FlatMapIterDataset / OperationIterDataset         a flat map, grain's legacy Operations
      -> RecordDataIterDataset                          loader/output_stages.py: each
                                                        record's data
      -> mp_prefetch (worker_count > 0)                 dataset/parallel/mp_prefetch.py,
                                                        workers/: worker w computes positions
                                                        w, w + W, ... of the shard; batches
                                                        are written once, into shared memory
      -> LoaderStateIterDataset                         loader/output_stages.py: grain's
                                                        legacy JSON state
      -> DataLoaderIterator                             loader/data_loader.py

A batch over maps and filters over the reading takes whole chunks of records
(``dataset/transformations/chunk.py``), as every Dataset pipeline
``to_iter_dataset().map(f).filter(g).batch(n)`` does: each function runs in a
loop over the records the batch needs, on the records' data and metadata
columns, with no ``Record`` per record and a record's rng built only when a
random transform asks for it; big records are copied into their batch's rows as
they come. Positions count the shard's stream: shard-local position ``p`` is the
sampler's global index ``p * shard_count + shard_index``. The state of
everything below the top is the Dataset API's (``{"next_index": p}`` per worker,
with the positions still to skip after an elastic restore).
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
    describe_op,
    is_flat_map,
)
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.options import MultiprocessingOptions, ReadOptions
from grainlike.dataset.transformations.flatmap import FlatMapIterDataset
from grainlike.loader import legacy_state as state_lib
from grainlike.loader import record_transforms as ops
from grainlike.loader.output_stages import LoaderStateIterDataset, RecordDataIterDataset
from grainlike.loader.records import SamplerMapDataset


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


def _producer(operations: Sequence[Any], at: int, data_source: Any) -> Any:
    """What made the elements ``operations[at]`` receives: the operation before (not a filter), or the source."""
    return next((op for op in reversed(operations[:at]) if not isinstance(op, FilterTransform)), ops.Source(data_source))


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
    for i, op in enumerate(operations):
        if isinstance(op, Batch):
            producer = _producer(operations, i, records.data_source)
            ds = ds.batch(op.batch_size, drop_remainder=op.drop_remainder, batch_fn=ops.RecordBatch(op, i, padding, producer))
            padding = None  # The first Batch masks the padding (check_padding_sampler).
        elif isinstance(op, FilterTransform):
            ds = ds.filter(ops.RecordFilter(op, i))
        elif isinstance(op, RandomMapTransform):
            ds = ds.map(ops.RecordRandomMap(op, i))
        elif isinstance(op, MapWithIndexTransform):
            ds = ds.map(ops.RecordMapWithIndex(op, i))
        elif isinstance(op, MapTransform):
            ds = ds.map(ops.RecordMap(op, i))
        elif is_flat_map(op):
            ds = FlatMapIterDataset(ds, ops.RecordFlatMap(op))
        else:
            ds = ops.OperationIterDataset(ds, op, i)
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
        from grainlike.dataset.parallel.mp_prefetch import MultiprocessPrefetchIterDataset

        # A failed worker stops them all; the next next() restarts every worker
        # from its last delivered output (grain's mp_prefetch would go on without
        # the failed worker).
        ds = MultiprocessPrefetchIterDataset(ds, multiprocessing_options, error_ends_worker=False)
    if any(is_flat_map(op) for op in operations):
        # grain checkpoints a loader with a flat map by its Dataset state, not
        # the legacy JSON state (whose positions count records, not splits).
        return ds
    return LoaderStateIterDataset(ds, codec)
