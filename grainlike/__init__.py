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

from grainlike.core.record import Record, RecordMetadata
from grainlike.builder import LoaderBuilder, from_source
from grainlike.core.config import config
from grainlike.core.meta_features import (
    DATASET_INDEX,
    EPOCH,
    INDEX,
    META_FEATURES,
    RECORD,
    RECORD_KEY,
    SEED,
)
from grainlike.core.lazy import attach as _attach
from grainlike.core.operations import (
    BatchOperation,
    FilterOperation,
    MapOperation,
    Operation,
    RandomMapOperation,
)
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
from grainlike.dataset import (
    DatasetIterator,
    DatasetSelectionMap,
    IterDataset,
    MapDataset,
)
from grainlike.dataset.options import MultiprocessingOptions, ReadOptions
from grainlike.loader.data_loader import DataLoader, DataLoaderIterator, PyGrainDatasetIterator
from grainlike.loader.load import load
from grainlike.loader.legacy_state import InvalidStateError
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

# Loaded on first use: grain's submodules and the names whose modules import jax,
# orbax or shared memory. The orbax and jax ones are left out of __all__, so that
# a star import stays light.
_LAZY = {
    **{
        name: f"grainlike.{name}"
        for name in (
            "checkpoint",
            "constants",
            "experimental",
            "multiprocessing",
            "python",
            "samplers",
            "sharding",
            "transforms",
        )
    },
    "SharedMemoryArray": "grainlike.core.shared_memory_array:SharedMemoryArray",
    "PyGrainCheckpointHandler": "grainlike.orbax:PyGrainCheckpointHandler",
    "PyGrainCheckpointSave": "grainlike.orbax:PyGrainCheckpointSave",
    "PyGrainCheckpointRestore": "grainlike.orbax:PyGrainCheckpointRestore",
    "DeviceIterator": "grainlike.device:DeviceIterator",
    "make_global_batch": "grainlike.device:make_global_batch",
    "element_spec": "grainlike.specs:element_spec",
    "zeros_batch": "grainlike.specs:zeros_batch",
    "evaluate": "grainlike.evaluation:evaluate",
    "InJitIterator": "grainlike.in_jit:InJitIterator",
    # JaxSGMC-style data access and saving inside jit (grainlike only).
    "reference_data": "grainlike.jax_loops:reference_data",
    "full_reference_data": "grainlike.jax_loops:full_reference_data",
    "full_data_mapper": "grainlike.jax_loops:full_data_mapper",
    "host_errors": "grainlike.jax_loops:host_errors",
    "ArraysSource": "grainlike.jax_loops:ArraysSource",
    "io": "grainlike.io",
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

# Workers start from a server when they cannot fork from this process (JAX
# initialised, reader or OpenCV threads running): boot it now, beside the
# program's own set-up, rather than at the first iterator.
from grainlike.workers import server as _worker_server  # noqa: E402

_worker_server.start_server_early()
