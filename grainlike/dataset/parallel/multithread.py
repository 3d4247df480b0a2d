"""``multithread_prefetch``: a pipeline computed by several threads, one slice each.

Thread ``i`` of ``n`` iterates over its own copy of the dataset, sliced and
seeded as ``mp_prefetch``'s worker ``i`` would be; an ``InterleaveIterDataset``
takes the copies in turn, so the order and state are ``mp_prefetch``'s.
"""

from __future__ import annotations

from typing import Any

from grainlike.dataset.nodes import worker_slice
from grainlike.dataset.nodes.dataset_node import walk
from grainlike.dataset.nodes.element_spec import parent_element_spec
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator, MultiprocessingContext
from grainlike.dataset.transformations.interleave import InterleaveIterDataset


class _MpContextIterDataset(IterDataset):
    """Tells the iterators of ``parent`` they run as process ``i`` of ``n``."""

    _element_spec = parent_element_spec

    def __init__(self, parent: IterDataset, mp_context: MultiprocessingContext):
        super().__init__(parent)
        self._mp_context = mp_context

    def __iter__(self) -> DatasetIterator:
        it = self._parent.__iter__()
        it._ctx.mp_context = self._mp_context
        return it

    def __str__(self) -> str:
        return f"_MpContextIterDataset(mp_context={self._mp_context})"


def _dataset_options(ds: IterDataset) -> Any:
    """The ``DatasetOptions`` of every ``WithOptionsIterDataset`` in ``ds``, downstream first."""
    from grainlike.dataset.nodes.options import DatasetOptions
    from grainlike.dataset.transformations.seed import WithOptionsIterDataset

    result = DatasetOptions()
    for node in walk(ds):
        if isinstance(node, WithOptionsIterDataset):
            result = result.merge(node.options)
    return result


def multithread_prefetch(
    ds: IterDataset, num_threads: int, buffer_size: int, sequential_slice: bool = False
) -> IterDataset:
    """Computes ``ds`` in ``num_threads`` threads, each on a slice of it.

    Threads help where the pipeline's work releases the GIL (I/O, numpy, native
    decoders) or on free-threaded Python; pure-Python transforms are better served
    by ``mp_prefetch``.

    Args:
      ds: the dataset; with more than one thread, a stage upstream must be
        sliceable (``to_iter_dataset()``, an interleave), as for ``mp_prefetch``.
      num_threads: threads; 0 returns ``ds`` unchanged.
      buffer_size: elements each thread computes ahead.
      sequential_slice: each thread reads a contiguous range of the sources
        (``MapDataset.source``, ``MapDataset.range``) instead of every
        ``num_threads``-th element of ``to_iter_dataset()``; a shuffle above a
        source then shuffles within each thread's range.

    Returns:
      An IterDataset with ``ds``'s elements in ``mp_prefetch``'s order.

    Raises:
      ValueError: ``ds`` has a source that cannot be sliced (with 2+ threads).

    Example:
      >>> from grainlike.dataset import MapDataset
      >>> ds = MapDataset.range(6).to_iter_dataset().map(lambda x: x * 10)
      >>> list(multithread_prefetch(ds, num_threads=2, buffer_size=2))
      [0, 10, 20, 30, 40, 50]
      >>> ds = MapDataset.range(6).to_iter_dataset()
      >>> list(multithread_prefetch(ds, num_threads=2, buffer_size=2, sequential_slice=True))
      [0, 3, 1, 4, 2, 5]
    """
    if num_threads == 0:
        return ds
    from grainlike.dataset.transformations.seed import WithOptionsIterDataset

    options = _dataset_options(ds)
    shards = []
    for i in range(num_threads):
        shard = ds
        if num_threads > 1:
            shard = worker_slice.copy_stages(ds, sequential_slice)
            worker_slice.set_slice(shard, slice(i, None, num_threads), sequential_slice)
        shards.append(_MpContextIterDataset(shard, MultiprocessingContext(process_index=i, process_count=num_threads)))
    interleaved = InterleaveIterDataset(shards, cycle_length=num_threads, iter_buffer_size=buffer_size)
    # The interleave passes no options from its inputs downstream: set them again.
    return WithOptionsIterDataset(interleaved, options)
