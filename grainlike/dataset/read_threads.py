"""Whether ``to_iter_dataset()`` without ``ReadOptions`` reads and maps in threads.

grain reads a MapDataset, and runs its maps, in 16 threads by default. grainlike
does so when some work under ``to_iter_dataset()`` waits, and otherwise reads in
the calling thread, where work known to be local and CPU-bound is fastest. The
decision is made from the stages' and sources' types and the ``waits`` they
declare (``grainlike.sources.DeclaresWaiting``), never from a timing:

* a source: ``grainlike.sources.waiting.source_waits`` (in memory and local
  files do not wait; remote files and sources of the user's own types do);
* a map, random map, map with index, filter, flat map or ``batch_fn``: the
  user's code waits unless its transform (or function) declares
  ``waits = False``. Threads also pay for CPU-bound maps that release the GIL
  (OpenCV's decode and resize: 2.0x on two cores, see docs/performance.md);
* grainlike's own stages (shuffle, slice, repeat, mix, zip, batch, seed):
  nothing of their own waits;
* a MapDataset of a type grainlike does not know: waits unless it declares
  ``waits = False`` (its own work; its parents are looked at as well).

Example:
    >>> from grainlike.dataset.base import MapDataset
    >>> pipeline_waits(MapDataset.range(8).shuffle(seed=0).batch(2))
    False
    >>> pipeline_waits(MapDataset.range(8).map(lambda x: x + 1))
    True
"""

from __future__ import annotations

from typing import Any

from grainlike.dataset.dataset_node import parents
from grainlike.dataset.map_dataset import MapDataset
from grainlike.sources.waiting import declared_waits, source_waits


def _code_waits(fn: Any) -> bool:
    """Whether the user's transform or function ``fn`` waits: yes unless it declares not."""
    declared = declared_waits(fn)
    return True if declared is None else declared


def stage_types() -> tuple[tuple, tuple]:
    """grainlike's MapDataset types: (those running user code, those running none of their own).

    A MapDataset type in neither declares ``waits`` (the loader's sampler stage)
    or is treated as unknown.
    """
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
    if isinstance(node, none_of_their_own):
        return False
    declared = declared_waits(node)
    return True if declared is None else declared


def _inputs(node: MapDataset) -> list:
    """The datasets ``node`` reads: its parents, and a MapDataset given as a source."""
    from grainlike.dataset.source import SourceMapDataset

    inputs = list(parents(node))
    if isinstance(node, SourceMapDataset) and isinstance(node._source, MapDataset):
        inputs.append(node._source)
    return inputs


def pipeline_waits(ds: MapDataset) -> bool:
    """Whether any work under ``ds`` waits (see the module docstring)."""
    to_visit, seen = [ds], set()
    while to_visit:
        node = to_visit.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if _own_work_waits(node):
            return True
        to_visit.extend(_inputs(node))
    return False
