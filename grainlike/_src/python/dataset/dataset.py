from grainlike import MapDataset, IterDataset, DatasetIterator
from grainlike.experimental import apply_transformations, WithOptionsIterDataset
from grainlike.dataset.nodes.element_spec import get_element_spec
from grainlike.dataset.base import get_next_index, set_next_index
from grainlike.dataset.execution_stats import get_execution_summary

__all__ = ['DatasetIterator', 'IterDataset', 'MapDataset', 'WithOptionsIterDataset', 'apply_transformations', 'get_element_spec', 'get_execution_summary', 'get_next_index', 'set_next_index']
