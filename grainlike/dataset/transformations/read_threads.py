"""Whether ``to_iter_dataset()`` without ``ReadOptions`` reads and maps in threads.

grain reads a MapDataset, and runs its maps, in 16 threads by default. grainlike
does so when some work under ``to_iter_dataset()`` waits, and otherwise reads in
the calling thread, where local CPU-bound work is fastest. The decision follows
the stages' and sources' types and the ``waits`` they declare
(``grainlike.sources.DeclaresWaiting``), never a timing. Each stage says whether
the work it does itself waits (``MapDataset._own_work_waits``): a source as
``source_waits`` says; user code (maps, filters, flat maps, ``batch_fn``) and
MapDatasets of unknown types unless they declare ``waits = False``; grainlike's
own stages that run no code of their own do not.

Example:
    >>> from grainlike.dataset.base import MapDataset
    >>> pipeline_waits(MapDataset.range(8).shuffle(seed=0).batch(2))
    False
    >>> pipeline_waits(MapDataset.range(8).map(lambda x: x + 1))
    True
"""

from __future__ import annotations

from grainlike.dataset.nodes.dataset_node import walk
from grainlike.dataset.nodes.map_dataset import MapDataset, code_waits


def pipeline_waits(ds: MapDataset) -> bool:
    """Whether any work under ``ds`` waits (see the module docstring)."""
    return any(
        node._own_work_waits() if isinstance(node, MapDataset) else code_waits(node) for node in walk(ds)
    )
