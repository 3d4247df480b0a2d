"""Cutting a copy of a pipeline down to one worker's share, in place (grain's ``set_slice``).

``mp_prefetch`` and ``multithread_prefetch`` give worker ``w`` of ``W`` its own
copy of the stages (``copy_stages``) and call ``set_slice(copy, slice(w, None,
W), sequential_slice)``: on each path up the pipeline, the nearest stage that
slices itself in place (``SupportsInPlaceSlicing``) does.

* ``sequential_slice=False`` (the default): ``to_iter_dataset()``'s stage keeps
  the indices ``w, w + W, ...`` of its MapDataset.
* ``sequential_slice=True`` (grain's experimental option): the sources
  (``MapDataset.source``, ``MapDataset.range``) each keep the contiguous range
  ``even_split(len, shard w of W)``, and a shuffle above a source shuffles
  within it. As in grain, stages between the source and ``to_iter_dataset()``
  that fixed their length when built (batch, slice, repeat, mix, zip) keep it.
"""

from __future__ import annotations

import copy
from typing import Any

from grainlike.core import sharding
from grainlike.core.protocols import SupportsInPlaceSlicing
from grainlike.dataset.nodes.dataset_node import parents
from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.map_dataset import MapDataset


def set_slice(ds: Any, sl: slice, sequential_slice: bool = False) -> None:
    """Makes ``ds`` (a worker's copy, see ``copy_stages``) compute only its share, in place.

    Args:
      ds: the worker's copy of the pipeline.
      sl: ``slice(worker_index, None, worker_count)``.
      sequential_slice: contiguous ranges of the sources instead of every
        ``worker_count``-th element of ``to_iter_dataset()`` (see the module
        docstring).

    Raises:
      ValueError: a path up the pipeline reaches a source that cannot be sliced.
    """
    if isinstance(ds, SupportsInPlaceSlicing):
        ds.set_slice(sl, sequential_slice)
        return
    if not parents(ds):
        kind = "MapDataset" if isinstance(ds, MapDataset) else "IterDataset"
        raise ValueError(
            f"Cannot slice `{kind}` source. {type(ds)}: mp_prefetch gives each worker a "
            "slice of the dataset, which needs a MapDataset turned into an IterDataset "
            "with to_iter_dataset() (or a stage with set_slice) upstream"
            + (
                "; with sequential_slice=True, every source below it must be "
                "MapDataset.source(...) or MapDataset.range(...) (or have set_slice)"
                if sequential_slice
                else ""
            )
        )
    for parent in parents(ds):
        set_slice(parent, sl, sequential_slice)


def copy_stages(ds: Any, sequential_slice: bool = False) -> Any:
    """A copy of ``ds`` that ``set_slice(copy, ..., sequential_slice)`` may change.

    Every iterator stage is copied (shallowly); with ``sequential_slice`` every
    MapDataset stage too, since the sources at their top are sliced. Sources'
    data and user transforms stay shared.
    """
    if not (sequential_slice or isinstance(ds, IterDataset)):
        return ds
    out = copy.copy(ds)
    if parents(ds):
        out._parents = tuple(copy_stages(p, sequential_slice) for p in parents(ds))
    return out


def sequential_range(num_elements: int, sl: slice, where: Any) -> tuple[int, int]:
    """``[start, end)`` of worker ``sl.start`` of ``sl.step`` among ``num_elements`` (grain's even split).

    Raises:
      ValueError: ``sl`` is not ``slice(worker_index, None, worker_count)`` with
        ``0 <= worker_index < worker_count``.
    """
    index, count = sl.start, sl.step
    valid = (
        isinstance(index, int)
        and isinstance(count, int)
        and not isinstance(index, bool)
        and not isinstance(count, bool)
        and 0 <= index < count
        and sl.stop is None
    )
    if not valid:
        raise ValueError(
            f"{where}: a sequential slice must be slice(worker_index, None, worker_count) "
            f"with 0 <= worker_index < worker_count, got {sl}"
        )
    options = sharding.ShardOptions(shard_index=index, shard_count=count, drop_remainder=False)
    return sharding.even_split(num_elements, options)
