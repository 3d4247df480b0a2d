"""grain's Dataset API: ``MapDataset``, ``IterDataset`` and ``DatasetIterator``.

Each transformation is one stage module (``map``, ``filter``, ``batch``, ``shuffle``,
``repeat``, ``slice``, ``mix``, ``prefetch``, ...) speaking the protocol of ``base``.
The stages grain exposes in ``grain.experimental`` are here too.
"""

from grainlike.dataset.iter_dataset import IterDataset
from grainlike.dataset.iterator import DatasetIterator, get_next_index, set_next_index
from grainlike.dataset.map_dataset import DatasetSelectionMap, MapDataset, apply_transformations
from grainlike.dataset.batch import batch_and_pad
from grainlike.dataset.flatmap import FlatMapIterDataset, FlatMapMapDataset
from grainlike.dataset.limit import LimitIterDataset
from grainlike.dataset.options import DatasetOptions, ExecutionTrackingMode
from grainlike.dataset.repeat import RepeatIterDataset
from grainlike.dataset.seed import WithOptionsIterDataset
from grainlike.dataset.shuffle import WindowShuffleIterDataset, WindowShuffleMapDataset
from grainlike.dataset.thread_prefetch import ThreadPrefetchDatasetIterator, ThreadPrefetchIterDataset
from grainlike.dataset.zip import ZipIterDataset, ZipMapDataset

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
