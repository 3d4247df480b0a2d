from grainlike.experimental import ThreadPrefetchIterDataset
from grainlike.dataset.prefetch import PrefetchDatasetIterator, PrefetchIterDataset
from grainlike.dataset.thread_prefetch import ThreadPrefetchDatasetIterator
from grainlike.dataset.multithread import multithread_prefetch
from grainlike.dataset.worker_slice import SupportsInPlaceSlicing

__all__ = ['PrefetchDatasetIterator', 'PrefetchIterDataset', 'SupportsInPlaceSlicing', 'ThreadPrefetchDatasetIterator', 'ThreadPrefetchIterDataset', 'multithread_prefetch']
