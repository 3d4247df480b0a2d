from grainlike.experimental import ThreadPrefetchIterDataset
from grainlike.dataset.transformations.prefetch import PrefetchDatasetIterator, PrefetchIterDataset
from grainlike.dataset.transformations.thread_prefetch import ThreadPrefetchDatasetIterator
from grainlike.dataset.parallel.multithread import multithread_prefetch
from grainlike.dataset.nodes.worker_slice import SupportsInPlaceSlicing

__all__ = ['PrefetchDatasetIterator', 'PrefetchIterDataset', 'SupportsInPlaceSlicing', 'ThreadPrefetchDatasetIterator', 'ThreadPrefetchIterDataset', 'multithread_prefetch']
