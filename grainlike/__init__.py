"""grainlike: a fast, fault-safe drop-in for Grain (``grain`` and ``grain.python``).

``import grainlike as grain`` (or ``import grainlike.python as grain``) runs code
written for grain 0.2.18 unchanged, with the same records in the same order and
checkpoints that restore in either library. This package has the names of both
``grain`` and ``grain.python``, and its modules mirror grain's: ``checkpoint``,
``constants``, ``experimental``, ``monitoring``, ``multiprocessing``,
``samplers``, ``sharding``, ``sources`` and ``transforms``; ``config`` is
grain's options object. Importing
it loads numpy and the standard library only; jax, orbax, tfds and cv2 load when
a feature needs them.
"""

import os as _os

# grain's opt-in telemetry (grainlike.monitoring): its folder of per-process
# metric files is named before the worker server below starts, so that the
# server's workers write theirs there too.
_TELEMETRY = _os.environ.get("ENABLE_PYGRAIN_PROMETHEUS_TELEMETRY", "false").lower() == "true"
if _TELEMETRY:
    from grainlike.core import monitoring as _monitoring

    _monitoring.use_multiprocess_directory()

# Workers start from a server when they cannot fork from this process (JAX
# initialised, reader or OpenCV threads running): boot it first, beside the rest
# of this import and the program's own set-up, rather than at the first iterator.
from grainlike.workers import server as _worker_server

_worker_server.start_server_early()

# numpy's thread pool, started now, is the baseline of the threads a fork of this
# process may copy (``fork_is_safe``).
import numpy as _numpy  # noqa: E402,F401

_worker_server.note_threads_at_import()

if _TELEMETRY:
    # After the baseline of threads above: the metrics server's thread makes
    # workers start from the worker server rather than fork this process. Only
    # the program's process serves; the worker server and workers just record.
    _monitoring.setup_telemetry(serve=not _worker_server._started_by_multiprocessing())

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
    from grainlike.dataset.nodes.options import MultiprocessingOptions, ReadOptions
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
# stages (the first batch waits on its boot: W4c in docs/performance.md).
# Module -> the names of ``__all__`` it holds: those of the TYPE_CHECKING imports.
_PUBLIC = {
    "grainlike.builder": ("LoaderBuilder", "from_source"),
    "grainlike.core.config": ("config",),
    "grainlike.core.meta_features": (
        "DATASET_INDEX", "EPOCH", "INDEX", "META_FEATURES", "RECORD", "RECORD_KEY", "SEED",
    ),
    "grainlike.core.operations": (
        "BatchOperation", "FilterOperation", "MapOperation", "Operation", "RandomMapOperation",
    ),
    "grainlike.core.record": ("Record", "RecordMetadata"),
    "grainlike.core.samplers": ("IndexSampler", "Sampler", "SequentialSampler"),
    "grainlike.core.sampling": ("PaddedEpochSampler", "RandomSampler"),
    "grainlike.core.sharding": ("NoSharding", "ShardByJaxProcess", "ShardOptions"),
    "grainlike.core.transforms": (
        "Batch", "FilterTransform", "MapTransform", "MapWithIndexTransform", "RandomMapTransform", "Transformation",
        "Transformations",
    ),
    "grainlike.dataset": ("DatasetIterator", "DatasetSelectionMap", "IterDataset", "MapDataset"),
    "grainlike.dataset.nodes.options": ("MultiprocessingOptions", "ReadOptions"),
    "grainlike.loader.data_loader": ("DataLoader", "DataLoaderIterator", "PyGrainDatasetIterator"),
    "grainlike.loader.legacy_state": ("InvalidStateError",),
    "grainlike.loader.load": ("load",),
    "grainlike.sources": (
        "ArrayRecordDataSource", "InMemoryDataSource", "RandomAccessDataSource", "RangeDataSource",
        "SharedMemoryDataSource", "TfdsDataSource", "tfds_source",
    ),
}
# Left out of __all__, so that a star import stays light: the names whose modules
# import jax or orbax, and grainlike's own additions.
_MORE = {
    "grainlike.core.shared_memory_array": ("SharedMemoryArray",),
    "grainlike.checkpoint.orbax_handler": (
        "PyGrainCheckpointHandler", "PyGrainCheckpointSave", "PyGrainCheckpointRestore",
    ),
    "grainlike.jax.device_iterator": ("DeviceIterator", "make_global_batch"),
    "grainlike.jax.batch_specs": ("element_spec", "zeros_batch"),
    "grainlike.jax.evaluation": ("evaluate",),
    "grainlike.jax.in_jit_iterator": ("InJitIterator",),
    # JaxSGMC-style data access and saving inside jit (grainlike only).
    "grainlike.jax.reference_data": ("reference_data",),
    "grainlike.jax.full_data": ("full_reference_data", "full_data_mapper"),
    "grainlike.jax.host_callbacks": ("host_errors",),
    "grainlike.jax.jit_batches": ("ArraysSource",),
    # Errors from worker processes and shared memory (grainlike only).
    "grainlike.core.errors": (
        "WorkerError", "WorkerDiedError", "WorkerStalledError", "ForeignWorkersError", "SharedMemoryFullError",
    ),
    # Sources of Parquet files, Hugging Face datasets, remote files (grainlike only).
    "grainlike.sources.parquet": ("ParquetDataSource",),
    "grainlike.sources.hf": ("HuggingFaceDataSource",),
    "grainlike.sources.formats.remote_files": ("RemoteOptions",),
}
# Submodules, attributes before they are imported as grain's are after ``import
# grain``; ``loader`` is also callable (grainlike.loader(source) is the builder),
# ``formats`` is the record format grainlike-convert writes (grainlike only), and
# ``_src`` holds grain's private module paths.
_SUBMODULES = (
    "_src", "checkpoint", "constants", "experimental", "formats", "loader", "multiprocessing", "proto", "python",
    "samplers", "sharding", "sources", "transforms",
)
_LAZY = {name: f"{module}:{name}" for table in (_PUBLIC, _MORE) for module, names in table.items() for name in names}
_LAZY.update(
    {name: f"grainlike.{name}" for name in _SUBMODULES}, io="grainlike.jax.in_jit_saving",
    # grain.monitoring is grain._src.core.monitoring itself, as here.
    monitoring="grainlike._src.core.monitoring",
)

__getattr__, __dir__ = _attach(globals(), _LAZY)

# ``grainlike.loader(source)`` starts the notebook builder (``from_source``): the
# package (whose ``__init__`` imports nothing) gets a callable module class here,
# where the builder above it may be named.
from grainlike import loader as _loader  # noqa: E402


class _CallableLoaderPackage(type(_loader)):
    def __call__(self, source: "object") -> "LoaderBuilder":
        from grainlike.builder import from_source

        return from_source(source)


_loader.__class__ = _CallableLoaderPackage

__all__ = sorted([*(name for names in _PUBLIC.values() for name in names), "SharedMemoryArray", "experimental"])
