"""grainlike: a fast, fault-safe drop-in for Grain (``grain`` and ``grain.python``).

``import grainlike as grain`` (or ``import grainlike.python as grain``) runs code
written for grain 0.2.18 unchanged, with the same records in the same order and
checkpoints that restore in either library. This package has the names of both
``grain`` and ``grain.python``, and its modules mirror grain's: ``checkpoint``,
``constants``, ``experimental``, ``multiprocessing``, ``samplers``, ``sharding``,
``sources`` and ``transforms``; ``config`` is grain's options object. Importing
it loads numpy and the standard library only; jax, orbax, tfds and cv2 load when
a feature needs them.
"""

# Workers start from a server when they cannot fork from this process (JAX
# initialised, reader or OpenCV threads running): boot it first, beside the rest
# of this import and the program's own set-up, rather than at the first iterator.
from grainlike.workers import server as _worker_server

_worker_server.start_server_early()

# numpy's thread pool, started now, is the baseline of the threads a fork of this
# process may copy (``fork_is_safe``).
import numpy as _numpy  # noqa: E402,F401

_worker_server.note_threads_at_import()

from typing import TYPE_CHECKING  # noqa: E402

from grainlike.core.lazy import attach as _attach  # noqa: E402

if TYPE_CHECKING:
    # What static tools (type checkers, IDEs, the API docs) read; at run time
    # these names come from _LAZY below (tests check that both agree).
    from grainlike.builder import LoaderBuilder, from_source
    from grainlike.core.config import config
    from grainlike.core.meta_features import DATASET_INDEX, EPOCH, INDEX, META_FEATURES, RECORD, RECORD_KEY, SEED
    from grainlike.core.operations import BatchOperation, FilterOperation, MapOperation, Operation, RandomMapOperation
    from grainlike.core.record import Record, RecordMetadata
    from grainlike.core.samplers import IndexSampler, Sampler, SequentialSampler
    from grainlike.core.sampling import PaddedEpochSampler, RandomSampler
    from grainlike.core.sharding import NoSharding, ShardByJaxProcess, ShardOptions
    from grainlike.core.transforms import (
        Batch,
        FilterTransform,
        MapTransform,
        MapWithIndexTransform,
        RandomMapTransform,
        Transformation,
        Transformations,
    )
    from grainlike.dataset import DatasetIterator, DatasetSelectionMap, IterDataset, MapDataset
    from grainlike.dataset.options import MultiprocessingOptions, ReadOptions
    from grainlike.loader.data_loader import DataLoader, DataLoaderIterator, PyGrainDatasetIterator
    from grainlike.loader.legacy_state import InvalidStateError
    from grainlike.loader.load import load
    from grainlike.sources import (
        ArrayRecordDataSource,
        InMemoryDataSource,
        RandomAccessDataSource,
        RangeDataSource,
        SharedMemoryDataSource,
        TfdsDataSource,
        tfds_source,
    )

__version__ = "0.1.0"

# Every name is loaded on first use, so that ``import grainlike`` costs numpy and
# the standard library only and the worker server, which imports
# ``grainlike.workers.main``, does not load the loader, builder and dataset
# stages (the first batch waits on its boot: W4c in docs/performance.md). The
# submodules and the names whose modules import jax or orbax are left out of
# __all__, so that a star import stays light.
_LAZY = {
    "Record": "grainlike.core.record:Record",
    "RecordMetadata": "grainlike.core.record:RecordMetadata",
    "LoaderBuilder": "grainlike.builder:LoaderBuilder",
    "from_source": "grainlike.builder:from_source",
    "config": "grainlike.core.config:config",
    "DATASET_INDEX": "grainlike.core.meta_features:DATASET_INDEX",
    "EPOCH": "grainlike.core.meta_features:EPOCH",
    "INDEX": "grainlike.core.meta_features:INDEX",
    "META_FEATURES": "grainlike.core.meta_features:META_FEATURES",
    "RECORD": "grainlike.core.meta_features:RECORD",
    "RECORD_KEY": "grainlike.core.meta_features:RECORD_KEY",
    "SEED": "grainlike.core.meta_features:SEED",
    "BatchOperation": "grainlike.core.operations:BatchOperation",
    "FilterOperation": "grainlike.core.operations:FilterOperation",
    "MapOperation": "grainlike.core.operations:MapOperation",
    "Operation": "grainlike.core.operations:Operation",
    "RandomMapOperation": "grainlike.core.operations:RandomMapOperation",
    "IndexSampler": "grainlike.core.samplers:IndexSampler",
    "Sampler": "grainlike.core.samplers:Sampler",
    "SequentialSampler": "grainlike.core.samplers:SequentialSampler",
    "PaddedEpochSampler": "grainlike.core.sampling:PaddedEpochSampler",
    "RandomSampler": "grainlike.core.sampling:RandomSampler",
    "NoSharding": "grainlike.core.sharding:NoSharding",
    "ShardByJaxProcess": "grainlike.core.sharding:ShardByJaxProcess",
    "ShardOptions": "grainlike.core.sharding:ShardOptions",
    "Batch": "grainlike.core.transforms:Batch",
    "FilterTransform": "grainlike.core.transforms:FilterTransform",
    "MapTransform": "grainlike.core.transforms:MapTransform",
    "MapWithIndexTransform": "grainlike.core.transforms:MapWithIndexTransform",
    "RandomMapTransform": "grainlike.core.transforms:RandomMapTransform",
    "Transformation": "grainlike.core.transforms:Transformation",
    "Transformations": "grainlike.core.transforms:Transformations",
    "DatasetIterator": "grainlike.dataset:DatasetIterator",
    "DatasetSelectionMap": "grainlike.dataset:DatasetSelectionMap",
    "IterDataset": "grainlike.dataset:IterDataset",
    "MapDataset": "grainlike.dataset:MapDataset",
    "MultiprocessingOptions": "grainlike.dataset.options:MultiprocessingOptions",
    "ReadOptions": "grainlike.dataset.options:ReadOptions",
    "DataLoader": "grainlike.loader.data_loader:DataLoader",
    "DataLoaderIterator": "grainlike.loader.data_loader:DataLoaderIterator",
    "PyGrainDatasetIterator": "grainlike.loader.data_loader:PyGrainDatasetIterator",
    "load": "grainlike.loader.load:load",
    "InvalidStateError": "grainlike.loader.legacy_state:InvalidStateError",
    "ArrayRecordDataSource": "grainlike.sources:ArrayRecordDataSource",
    "InMemoryDataSource": "grainlike.sources:InMemoryDataSource",
    "RandomAccessDataSource": "grainlike.sources:RandomAccessDataSource",
    "RangeDataSource": "grainlike.sources:RangeDataSource",
    "SharedMemoryDataSource": "grainlike.sources:SharedMemoryDataSource",
    "TfdsDataSource": "grainlike.sources:TfdsDataSource",
    "tfds_source": "grainlike.sources:tfds_source",
    **{
        name: f"grainlike.{name}"
        for name in (
            "checkpoint",
            "constants",
            "experimental",
            # The package is also callable: grainlike.loader(source) is the builder.
            "loader",
            "multiprocessing",
            "python",
            "samplers",
            "sharding",
            "transforms",
        )
    },
    "SharedMemoryArray": "grainlike.core.shared_memory_array:SharedMemoryArray",
    "PyGrainCheckpointHandler": "grainlike.checkpoint.orbax_handler:PyGrainCheckpointHandler",
    "PyGrainCheckpointSave": "grainlike.checkpoint.orbax_handler:PyGrainCheckpointSave",
    "PyGrainCheckpointRestore": "grainlike.checkpoint.orbax_handler:PyGrainCheckpointRestore",
    "DeviceIterator": "grainlike.jax.device_iterator:DeviceIterator",
    "make_global_batch": "grainlike.jax.device_iterator:make_global_batch",
    "element_spec": "grainlike.jax.batch_specs:element_spec",
    "zeros_batch": "grainlike.jax.batch_specs:zeros_batch",
    "evaluate": "grainlike.jax.evaluation:evaluate",
    "InJitIterator": "grainlike.jax.in_jit_iterator:InJitIterator",
    # JaxSGMC-style data access and saving inside jit (grainlike only).
    "reference_data": "grainlike.jax.reference_data:reference_data",
    "full_reference_data": "grainlike.jax.full_data:full_reference_data",
    "full_data_mapper": "grainlike.jax.full_data:full_data_mapper",
    "host_errors": "grainlike.jax.host_callbacks:host_errors",
    "ArraysSource": "grainlike.jax.jit_batches:ArraysSource",
    "io": "grainlike.jax.in_jit_saving",
    # Self-describing ArrayRecord files that grainlike-convert writes (grainlike only).
    "formats": "grainlike.formats",
    # Errors from worker processes and shared memory (grainlike only).
    "WorkerError": "grainlike.core.errors:WorkerError",
    "WorkerDiedError": "grainlike.core.errors:WorkerDiedError",
    "WorkerStalledError": "grainlike.core.errors:WorkerStalledError",
    "ForeignWorkersError": "grainlike.core.errors:ForeignWorkersError",
    "SharedMemoryFullError": "grainlike.core.errors:SharedMemoryFullError",
    # Sources of Parquet files, Hugging Face datasets, remote files (grainlike only).
    "ParquetDataSource": "grainlike.sources.parquet:ParquetDataSource",
    "HuggingFaceDataSource": "grainlike.sources.hf:HuggingFaceDataSource",
    "RemoteOptions": "grainlike.sources.formats.remote_files:RemoteOptions",
}

__getattr__, __dir__ = _attach(globals(), _LAZY)

__all__ = [
    "ArrayRecordDataSource",
    "Batch",
    "BatchOperation",
    "DATASET_INDEX",
    "DataLoader",
    "DataLoaderIterator",
    "DatasetIterator",
    "DatasetSelectionMap",
    "EPOCH",
    "FilterOperation",
    "FilterTransform",
    "INDEX",
    "InMemoryDataSource",
    "IndexSampler",
    "InvalidStateError",
    "IterDataset",
    "LoaderBuilder",
    "META_FEATURES",
    "MapDataset",
    "MapOperation",
    "MapTransform",
    "MapWithIndexTransform",
    "MultiprocessingOptions",
    "NoSharding",
    "Operation",
    "PaddedEpochSampler",
    "PyGrainDatasetIterator",
    "RECORD",
    "RECORD_KEY",
    "RandomAccessDataSource",
    "RandomMapOperation",
    "RandomMapTransform",
    "RandomSampler",
    "RangeDataSource",
    "ReadOptions",
    "Record",
    "RecordMetadata",
    "SEED",
    "Sampler",
    "SequentialSampler",
    "ShardByJaxProcess",
    "ShardOptions",
    "SharedMemoryArray",
    "SharedMemoryDataSource",
    "TfdsDataSource",
    "Transformation",
    "Transformations",
    "config",
    "experimental",
    "from_source",
    "load",
    "tfds_source",
]
