"""Random-access data sources (``grain.sources``).

``RandomAccessDataSource`` is the protocol (``__len__`` and ``__getitem__``, plus an
optional batched ``__getitems__``). ``RangeDataSource``, ``InMemoryDataSource``
(alias ``SharedMemoryDataSource``) and ``ArrayRecordDataSource`` have Grain's
reprs, so checkpoints move between grain and grainlike; ``ParquetDataSource``,
``HuggingFaceDataSource`` and ``TfDataSource`` are grainlike's own. File sources
read ``s3://`` / ``gs://`` URLs too (``RemoteOptions``).
"""

from grainlike.sources.array_record import ArrayRecordDataSource
from grainlike.sources.hf import HuggingFaceDataSource
from grainlike.sources.in_memory import InMemoryDataSource, SharedMemoryDataSource
from grainlike.sources.parquet import ParquetDataSource
from grainlike.sources.protocol import DeclaresWaiting, RandomAccessDataSource, RangeDataSource, SupportsBatchedRead
from grainlike.sources.formats.remote_files import RemoteOptions
from grainlike.sources.tf_data import TfDataSource
from grainlike.sources.tfds import TfdsDataSource, tfds_source

__all__ = [
    "ArrayRecordDataSource",
    "DeclaresWaiting",
    "HuggingFaceDataSource",
    "InMemoryDataSource",
    "ParquetDataSource",
    "RandomAccessDataSource",
    "RangeDataSource",
    "RemoteOptions",
    "SharedMemoryDataSource",
    "SupportsBatchedRead",
    "TfDataSource",
    "TfdsDataSource",
    "tfds_source",
]
