"""``grain.experimental``: grain's newer APIs, under the same names.

The names grain 0.2.18 has here that grainlike does not provide yet are listed,
with the reason, in ``docs/migrating.md``.
"""

from grainlike.core.index_shuffle import index_shuffle
from grainlike.core.transforms import FlatMapTransform, MapWithIndexTransform
from grainlike.dataset import (
    DatasetOptions,
    ExecutionTrackingMode,
    FlatMapIterDataset,
    FlatMapMapDataset,
    LimitIterDataset,
    RepeatIterDataset,
    ThreadPrefetchDatasetIterator,
    ThreadPrefetchIterDataset,
    WindowShuffleIterDataset,
    WindowShuffleMapDataset,
    WithOptionsIterDataset,
    ZipIterDataset,
    ZipMapDataset,
    apply_transformations,
    batch_and_pad,
    get_next_index,
    set_next_index,
)
from grainlike.dataset.conformance import assert_equal_output_after_checkpoint
from grainlike.dataset.elastic import ElasticIterator
from grainlike.dataset.packing import BestFitPackIterDataset, FirstFitPackIterDataset
from grainlike.dataset.packing_concat_split import BOSHandling, ConcatThenSplitIterDataset
from grainlike.core.pack_and_batch import PackAndBatchOperation
from grainlike.dataset.interleave import InterleaveIterDataset
from grainlike.dataset.tf_data_stream import TfDataIterDataset
from grainlike.dataset.tfrecord import TFRecordIterDataset
from grainlike.dataset.cache import CacheIterDataset
from grainlike.dataset.rebatch import RebatchIterDataset
from grainlike.dataset.multithread import multithread_prefetch
from grainlike.dataset.element_spec import ShapeDtypeStruct, ShapeDtypeStructProtocol, get_element_spec
from grainlike.jax.device_put import device_put
from grainlike.dataset.rng_pool import RngPool
from grainlike.dataset.performance import PerformanceConfig, pick_performance_config
from grainlike.dataset.parquet_iter_dataset import ParquetIterDataset

# Every name imported above.
__all__ = sorted(name for name in dir() if not name.startswith("_"))
