"""``loadax.dataset.transform``: datasets made of other datasets, computed lazily."""

from grainlike.compat.loadax.dataset.transform.combined import CombinedDataset as CombinedDataset
from grainlike.compat.loadax.dataset.transform.mapped import MappedDataset as MappedDataset
from grainlike.compat.loadax.dataset.transform.partial import PartialDataset as PartialDataset
from grainlike.compat.loadax.dataset.transform.sampled import (
    SampledDatasetWithoutReplacement as SampledDatasetWithoutReplacement,
)
from grainlike.compat.loadax.dataset.transform.sampled import (
    SampledDatasetWithReplacement as SampledDatasetWithReplacement,
)
from grainlike.compat.loadax.dataset.transform.shuffled import ShuffledDataset as ShuffledDataset
