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
from grainlike.dataset.parallel.elastic import ElasticIterator
from grainlike.dataset.transformations.packing import BestFitPackIterDataset, FirstFitPackIterDataset
from grainlike.dataset.transformations.packing_concat_split import BOSHandling, ConcatThenSplitIterDataset
from grainlike.core.pack_and_batch import PackAndBatchOperation
from grainlike.dataset.transformations.interleave import InterleaveIterDataset
from grainlike.dataset.sources.tf_data_stream import TfDataIterDataset
from grainlike.dataset.sources.tfrecord import TFRecordIterDataset
from grainlike.dataset.transformations.cache import CacheIterDataset
from grainlike.dataset.transformations.rebatch import RebatchIterDataset
from grainlike.dataset.parallel.multithread import multithread_prefetch
from grainlike.dataset.nodes.element_spec import ShapeDtypeStruct, ShapeDtypeStructProtocol, get_element_spec
from grainlike.jax.device_put import device_put
from grainlike.dataset.transformations.rng_pool import RngPool
from grainlike.dataset.parallel.performance import PerformanceConfig, pick_performance_config
from grainlike.dataset.sources.parquet_iter_dataset import ParquetIterDataset

# Every name imported above.
__all__ = sorted(name for name in dir() if not name.startswith("_"))
