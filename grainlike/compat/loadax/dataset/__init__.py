"""``loadax.dataset``: the dataset protocol and the in-memory and range datasets."""

from grainlike.compat.loadax.dataset.in_memory import InMemoryDataset as InMemoryDataset
from grainlike.compat.loadax.dataset.protocol import Dataset as Dataset
from grainlike.compat.loadax.dataset.range import RangeDataset as RangeDataset
