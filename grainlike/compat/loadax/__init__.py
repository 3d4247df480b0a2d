"""Loadax 0.2.1's API over grainlike: code written for Loadax runs with its imports changed.

``from loadax import X`` becomes ``from grainlike.compat.loadax import X`` (and
``loadax.sharding_utilities``, ``loadax.dataset...``, ``loadax.dataloader...``
the same way, below ``grainlike.compat.loadax``). Loadax's README calls the
builder ``DataLoader``; its package exports ``DataloaderBuilder``: both are here.

Datasets keep Loadax's ``get`` semantics and random draws (``ShuffledDataset``
and the sampled datasets draw with ``jax.random`` as Loadax does); the loaders
read through grainlike's DataLoader (read threads for Loadax's workers, its
``Batch`` for the batcher), and ``distribute_global_batch`` assembles global
arrays with ``grainlike.make_global_batch``. Where the two differ (Loadax
0.2.1 bugs, mostly), docs/jax_loops.md says how. jax is imported when a
function needs it, not by this import.
"""

# loadax/__init__.py of Loadax 0.2.1 sets this string.
__version__ = "0.0.1"

from grainlike.compat.loadax.batcher import Batcher as Batcher
from grainlike.compat.loadax.dataloader import Dataloader as Dataloader
from grainlike.compat.loadax.dataloader import DataloaderBuilder as DataloaderBuilder
from grainlike.compat.loadax.dataloader import NaiveDataloader as NaiveDataloader
from grainlike.compat.loadax.dataloader.sharding import DistributedShardingStrategy as DistributedShardingStrategy
from grainlike.compat.loadax.dataloader.sharding import NoShardingStrategy as NoShardingStrategy
from grainlike.compat.loadax.dataloader.sharding import ShardingStrategy as ShardingStrategy
from grainlike.compat.loadax.dataset import Dataset as Dataset
from grainlike.compat.loadax.dataset import InMemoryDataset as InMemoryDataset
from grainlike.compat.loadax.dataset.protocol import DatasetItem as DatasetItem
from grainlike.compat.loadax.dataset.protocol import DatasetIterator as DatasetIterator
from grainlike.compat.loadax.dataset.range import RangeDataset as RangeDataset
from grainlike.compat.loadax.dataset.transform import CombinedDataset as CombinedDataset
from grainlike.compat.loadax.dataset.transform import MappedDataset as MappedDataset
from grainlike.compat.loadax.dataset.transform import PartialDataset as PartialDataset
from grainlike.compat.loadax.dataset.transform import SampledDatasetWithoutReplacement as SampledDatasetWithoutReplacement
from grainlike.compat.loadax.dataset.transform import SampledDatasetWithReplacement as SampledDatasetWithReplacement
from grainlike.compat.loadax.dataset.transform import ShuffledDataset as ShuffledDataset
from grainlike.compat.loadax.sharding_utilities import ddp_sharding as ddp_sharding
from grainlike.compat.loadax.sharding_utilities import fsdp_sharding as fsdp_sharding

# The name Loadax's README uses for the builder.
DataLoader = DataloaderBuilder
