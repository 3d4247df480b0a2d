"""Whether ``mp_prefetch`` drops more elements than the same pipeline without workers."""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable, Optional

from grainlike.core.errors import WorkersDropRemaindersWarning
from grainlike.dataset.nodes import worker_slice
from grainlike.dataset.nodes.dataset_node import parents
from grainlike.dataset.nodes.iter_dataset import IterDataset


def _output_count(ds: Any, sl: Optional[slice]) -> Optional[tuple[int, Callable[[int], int]]]:
    """``(outputs, covered)`` of ``ds`` with its source sliced by ``sl`` (None: unsliced).

    ``outputs``: how many elements it yields; ``covered(k)``: how many source
    elements the first ``k`` of them hold. None where not known without
    iterating: any stage but maps, thread prefetch and batches over
    ``to_iter_dataset()`` of a finite MapDataset that nothing leaves with Nones.
    """
    from grainlike.dataset.transformations.batch import BatchIterDataset, discarding_stage
    from grainlike.dataset.transformations.map import MapIterDataset, MapWithIndexIterDataset, RandomMapIterDataset
    from grainlike.dataset.transformations.prefetch import PrefetchIterDataset
    from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchIterDataset

    if isinstance(ds, (MapIterDataset, RandomMapIterDataset, MapWithIndexIterDataset, ThreadPrefetchIterDataset)):
        return _output_count(ds._parent, sl)
    if isinstance(ds, BatchIterDataset):
        below = _output_count(ds._parent, sl)
        if below is None:
            return None
        n, covered, size = below[0], below[1], ds._batch_size
        outputs = n // size if ds._drop_remainder else -(-n // size)
        return outputs, lambda k: covered(min(k * size, n))
    if type(ds) is PrefetchIterDataset:  # to_iter_dataset(), where workers slice
        if not ds._allow_nones and discarding_stage(ds._parent) is not None:
            return None
        n = len(ds._parent)
        if n >= sys.maxsize:  # repeated forever: nothing is left over at an end
            return None
        return (n if sl is None else len(range(n)[sl])), lambda k: k
    return None


def _worker_output_count(
    parent: IterDataset, worker_index: int, num_workers: int, sequential_slice: bool
) -> Optional[tuple[int, Callable[[int], int]]]:
    """``_output_count`` of worker ``worker_index``'s slice of ``parent`` (None: not known)."""
    sl = slice(worker_index, None, num_workers)
    if not sequential_slice:
        return _output_count(parent, sl)
    # The sources are sliced: count on a sliced copy.
    ds = worker_slice.copy_stages(parent, sequential_slice=True)
    try:
        worker_slice.set_slice(ds, sl, sequential_slice=True)
    except (ValueError, NotImplementedError):
        return None  # The workers raise it.
    return _output_count(ds, None)


def warn_if_workers_drop_more(parent: IterDataset, num_workers: int, sequential_slice: bool = False) -> None:
    """Warns when ``parent.mp_prefetch`` delivers fewer elements than ``parent`` would.

    Each worker batches its own slice, so a ``batch(..., drop_remainder=True)``
    below ``mp_prefetch`` drops one partial batch per worker (grain 0.2.18 does
    the same; the output is kept). Decided from the lengths where
    ``_output_count`` knows them; otherwise nothing is said.
    """
    if num_workers < 2:
        return
    whole = _output_count(parent, None)
    if whole is None:
        return
    outputs, kept = whole[0], whole[1](whole[0])
    sliced = [_worker_output_count(parent, w, num_workers, sequential_slice) for w in range(num_workers)]
    if any(count is None for count in sliced):
        return
    worker_outputs = sum(count for count, _ in sliced)
    worker_kept = sum(covered(count) for count, covered in sliced)
    from grainlike.dataset.transformations.batch import BatchIterDataset

    if worker_kept >= kept:
        _warn_if_shares_below_batch(parent, num_workers, [covered(count) for count, covered in sliced])
        return

    batch = parent  # The drop_remainder=True batch nearest to the output (_output_count knows the stages).
    while not (isinstance(batch, BatchIterDataset) and batch._drop_remainder):
        batch = batch._parent
    source = parent
    while isinstance(source, IterDataset):  # down to the MapDataset under to_iter_dataset()
        source = source._parent
    warnings.warn(
        f"mp_prefetch(num_workers={num_workers}) delivers {worker_kept} of the "
        f"{len(source)} elements of its to_iter_dataset() in {worker_outputs} "
        f"outputs; the same pipeline without workers delivers {kept} in {outputs}: each "
        f"worker batches its own slice, and its {batch} drops each worker's partial last batch (as in grain, whose output "
        "and states grainlike keeps). To drop only the last partial batch, batch after "
        f"mp_prefetch (e.g. ....mp_prefetch(options).batch({batch._batch_size}, drop_remainder=True)).",
        WorkersDropRemaindersWarning,
        stacklevel=3,
    )


def _warn_if_shares_below_batch(parent: IterDataset, num_workers: int, shares: list) -> None:
    """Warns when a worker's slice holds fewer elements than the batch nearest the output.

    Each worker batches its own slice, so such a worker delivers only a partial
    batch (as in grain) where a pipeline without workers would fill one.
    """
    from grainlike.dataset.transformations.batch import BatchIterDataset

    batch = parent
    while not isinstance(batch, BatchIterDataset):
        above = parents(batch)
        if len(above) != 1 or not isinstance(above[0], IterDataset):
            return
        batch = above[0]
    size = batch._batch_size
    if min(shares) >= size:
        return
    fit = max(1, sum(shares) // size)
    warnings.warn(
        f"mp_prefetch(num_workers={num_workers}) splits {sum(shares)} elements among its workers; "
        f"{sum(n < size for n in shares)} of them get fewer than the {size} of {batch}, so they "
        f"deliver partial batches (as in grain). Use num_workers={fit}{' or 0' if fit == 1 else ' or fewer'}, "
        f"or batch after mp_prefetch (e.g. ....mp_prefetch(options).batch({size})).",
        WorkersDropRemaindersWarning,
        stacklevel=4,
    )
