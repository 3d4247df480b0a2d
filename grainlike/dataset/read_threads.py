"""Whether ``to_iter_dataset()`` without ``ReadOptions`` reads and maps in threads.

grain reads a MapDataset, and runs its maps, in 16 threads by default. grainlike
does so when some work under ``to_iter_dataset()`` waits, and otherwise reads in
the calling thread, where local CPU-bound work is fastest. The decision follows
the stages' and sources' types and the ``waits`` they declare
(``grainlike.sources.DeclaresWaiting``), never a timing: a source waits as
``source_waits`` says; user code (maps, filters, flat maps, ``batch_fn``) and
MapDatasets of unknown types wait unless they declare ``waits = False``;
grainlike's own stages do not.

Example:
    >>> from grainlike.dataset.base import MapDataset
    >>> pipeline_waits(MapDataset.range(8).shuffle(seed=0).batch(2))
    False
    >>> pipeline_waits(MapDataset.range(8).map(lambda x: x + 1))
    True
"""

from __future__ import annotations

from typing import Any

from grainlike.dataset.dataset_node import parents, walk
from grainlike.dataset.map_dataset import MapDataset
from grainlike.sources.waiting import declared_waits, source_waits


def _code_waits(fn: Any) -> bool:
    declared = declared_waits(fn)
    return True if declared is None else declared


def stage_types() -> tuple[tuple, tuple]:
    """grainlike's MapDataset types: (those running user code, those running none of their own)."""
    from grainlike.dataset.batch import BatchMapDataset
    from grainlike.dataset.flatmap import FlatMapMapDataset
    from grainlike.dataset.map import ElementwiseMapDataset
    from grainlike.dataset.mix import MixedMapDataset
    from grainlike.dataset.repeat import RepeatMapDataset
    from grainlike.dataset.seed import WithSeedMapDataset
    from grainlike.dataset.shuffle import ShuffleMapDataset, WindowShuffleMapDataset
    from grainlike.dataset.slice import SliceMapDataset
    from grainlike.dataset.source import RangeMapDataset, SourceMapDataset
    from grainlike.dataset.zip import ZipMapDataset

    user_code = (SourceMapDataset, ElementwiseMapDataset, FlatMapMapDataset, BatchMapDataset)
    none_of_their_own = (
        RangeMapDataset, ShuffleMapDataset, WindowShuffleMapDataset, SliceMapDataset,
        RepeatMapDataset, MixedMapDataset, ZipMapDataset, WithSeedMapDataset,
    )
    return user_code, none_of_their_own


def _own_work_waits(node: MapDataset) -> bool:
    """Whether the work ``node`` does itself (not its parents') waits."""
    from grainlike.dataset.batch import BatchMapDataset
    from grainlike.dataset.source import SourceMapDataset

    user_code, none_of_their_own = stage_types()
    if isinstance(node, user_code):
        if isinstance(node, SourceMapDataset):
            source = node._source
            return False if isinstance(source, MapDataset) else source_waits(source)
        if isinstance(node, BatchMapDataset):
            batch_fn = node._batcher.batch_fn
            return batch_fn is not None and _code_waits(batch_fn)
        return _code_waits(node._transform)  # maps, filters and flat maps
    return not isinstance(node, none_of_their_own) and _code_waits(node)


def _inputs(node: MapDataset) -> list:
    """The datasets ``node`` reads: its parents, and a MapDataset given as a source."""
    from grainlike.dataset.source import SourceMapDataset

    inputs = list(parents(node))
    if isinstance(node, SourceMapDataset) and isinstance(node._source, MapDataset):
        inputs.append(node._source)
    return inputs


def pipeline_waits(ds: MapDataset) -> bool:
    """Whether any work under ``ds`` waits (see the module docstring)."""
    return any(_own_work_waits(node) for node in walk(ds, _inputs))
