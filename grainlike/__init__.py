"""grainlike: a fast, fault-safe drop-in for Grain's DataLoader (``grain.python``).

``import grainlike as grain`` (or ``import grainlike.python as grain``) runs code
written for ``grain.python`` unchanged, with the same records in the same order and
checkpoints that restore in either library. Importing it loads numpy and the
standard library only; jax, orbax, tfds and cv2 load when a feature needs them.
"""

from grainlike.core.record import Record, RecordMetadata
from grainlike.builder import LoaderBuilder, from_source
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
from grainlike.loader.data_loader import DataLoader, DataLoaderIterator, PyGrainDatasetIterator
from grainlike.loader.load import load
from grainlike.loader.options import MultiprocessingOptions, ReadOptions
from grainlike.loader.state import InvalidStateError
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

# Orbax integration names load orbax on first use, not at import (and are left out
# of __all__ so that a star import stays light).
_LAZY = {
    "PyGrainCheckpointHandler": "grainlike.checkpoint",
    "PyGrainCheckpointSave": "grainlike.checkpoint",
    "PyGrainCheckpointRestore": "grainlike.checkpoint",
    "DeviceIterator": "grainlike.device",
    "make_global_batch": "grainlike.device",
    "element_spec": "grainlike.specs",
    "zeros_batch": "grainlike.specs",
    "evaluate": "grainlike.evaluation",
    "InJitIterator": "grainlike.in_jit",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'grainlike' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ArrayRecordDataSource",
    "Batch",
    "DataLoader",
    "DataLoaderIterator",
    "FilterTransform",
    "InMemoryDataSource",
    "IndexSampler",
    "LoaderBuilder",
    "InvalidStateError",
    "MapTransform",
    "MapWithIndexTransform",
    "MultiprocessingOptions",
    "NoSharding",
    "PaddedEpochSampler",
    "PyGrainDatasetIterator",
    "RandomAccessDataSource",
    "RandomMapTransform",
    "RandomSampler",
    "RangeDataSource",
    "ReadOptions",
    "Record",
    "RecordMetadata",
    "Sampler",
    "SequentialSampler",
    "ShardByJaxProcess",
    "ShardOptions",
    "SharedMemoryDataSource",
    "Transformation",
    "TfdsDataSource",
    "Transformations",
    "from_source",
    "load",
    "tfds_source",
]
