"""grain's Dataset API: ``MapDataset``, ``IterDataset`` and ``DatasetIterator``.

Each transformation is one stage module (``map``, ``filter``, ``batch``, ``shuffle``,
``repeat``, ``slice``, ``mix``, ``prefetch``, ...) speaking the protocol of ``base``.
The stages grain exposes in ``grain.experimental`` are here too.
"""

from grainlike.dataset.nodes import stage_registry

# Where each stage that MapDataset's and IterDataset's methods build is defined
# (see ``nodes/stage_registry.py``): the base names them, never imports them.
# Declared before any stage module is imported, so that none finds them missing.
stage_registry.declare("grainlike.dataset.sources.source", "RangeMapDataset", "SourceMapDataset")
stage_registry.declare("grainlike.dataset.transformations.batch", "BatchIterDataset", "BatchMapDataset")
stage_registry.declare("grainlike.dataset.transformations.filter", "FilterIterDataset", "FilterMapDataset")
stage_registry.declare("grainlike.dataset.transformations.flatmap", "FlatMapIterDataset", "FlatMapMapDataset")
stage_registry.declare(
    "grainlike.dataset.transformations.map",
    "MapIterDataset",
    "MapMapDataset",
    "MapWithIndexIterDataset",
    "MapWithIndexMapDataset",
    "RandomMapIterDataset",
    "RandomMapMapDataset",
)
stage_registry.declare(
    "grainlike.dataset.transformations.mix", "ConcatenateMapDataset", "MixedIterDataset", "MixedMapDataset"
)
stage_registry.declare("grainlike.dataset.transformations.prefetch", "PrefetchIterDataset")
stage_registry.declare("grainlike.dataset.transformations.repeat", "RepeatMapDataset")
stage_registry.declare("grainlike.dataset.transformations.seed", "WithSeedIterDataset", "WithSeedMapDataset")
stage_registry.declare("grainlike.dataset.transformations.shuffle", "ShuffleMapDataset")
stage_registry.declare("grainlike.dataset.transformations.slice", "ReindexMapDataset", "SliceMapDataset")
stage_registry.declare("grainlike.dataset.parallel.mp_prefetch", "MultiprocessPrefetchIterDataset")

from grainlike.dataset.nodes.iter_dataset import IterDataset
from grainlike.dataset.nodes.iterator import DatasetIterator, get_next_index, set_next_index
from grainlike.dataset.nodes.dataset_node import apply_transformations
from grainlike.dataset.nodes.map_dataset import DatasetSelectionMap, MapDataset
from grainlike.dataset.transformations.batch import batch_and_pad
from grainlike.dataset.transformations.flatmap import FlatMapIterDataset, FlatMapMapDataset
from grainlike.dataset.transformations.limit import LimitIterDataset
from grainlike.dataset.nodes.options import DatasetOptions, ExecutionTrackingMode
from grainlike.dataset.transformations.repeat import RepeatIterDataset
from grainlike.dataset.transformations.seed import WithOptionsIterDataset
from grainlike.dataset.transformations.shuffle import WindowShuffleIterDataset, WindowShuffleMapDataset
from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchDatasetIterator, ThreadPrefetchIterDataset
from grainlike.dataset.transformations.zip import ZipIterDataset, ZipMapDataset

__all__ = [
    "DatasetIterator",
    "DatasetOptions",
    "DatasetSelectionMap",
    "ExecutionTrackingMode",
    "FlatMapIterDataset",
    "FlatMapMapDataset",
    "IterDataset",
    "LimitIterDataset",
    "MapDataset",
    "RepeatIterDataset",
    "ThreadPrefetchDatasetIterator",
    "ThreadPrefetchIterDataset",
    "WindowShuffleIterDataset",
    "WindowShuffleMapDataset",
    "WithOptionsIterDataset",
    "ZipIterDataset",
    "ZipMapDataset",
    "apply_transformations",
    "batch_and_pad",
    "get_next_index",
    "set_next_index",
]
