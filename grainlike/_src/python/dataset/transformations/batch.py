from grainlike.core import tree_lib
from grainlike.dataset.transformations.batch import BatchFn, BatchIterDataset, BatchMapDataset, batch_and_pad, make_batch

__all__ = ['BatchFn', 'BatchIterDataset', 'BatchMapDataset', 'batch_and_pad', 'make_batch', 'tree_lib']
